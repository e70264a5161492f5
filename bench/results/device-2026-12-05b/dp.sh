#!/bin/bash
# d_run then p_run on gpu-bundle-x, each tarred into $OUT.
set -u
S=gpu-bundle-x/session
for x in d p; do
  start=$SECONDS
  bash $S/${x}_run.sh
  echo "$x rc=$? in $((SECONDS - start)) s"
  [ -d $OUT/$x ] && tar czf $OUT/$x.tgz -C $OUT $x && rm -rf $OUT/$x
done
ls -la $OUT
