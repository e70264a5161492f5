#!/bin/bash
# The two bundle steps call1 left unfinished: the NVRTC lib tests and the hybrid state gate.
set -u
B=gpu-bundle; bash $B/unpack.sh
export MET_HOME=/tmp/met-home-shared; mkdir -p $MET_HOME
R=/tmp/r2; rm -rf $R; mkdir -p $R
(bash $B/run.sh $R/a lib > $R/a.out 2>&1) &
(bash $B/run.sh $R/b gatestate > $R/b.out 2>&1) &
for i in $(seq ${LIMIT:-330}); do [ -n "$(jobs -r)" ] || break; sleep 1; done
echo "waited $i s"
for f in a b; do echo "######## $f"; sed -n '/======== met GPU summary/,/^$/p' $R/$f.out; grep -E "^== .*FAIL" -A12 $R/$f.out | head -30; done
tar czf $OUT/r2.tgz -C $R .
