#!/bin/bash
# Session 22, call 1: the full bundle (gpu-next build in gpu-bundle-next), three run.sh at once
# (unpacked once first: two run.sh unpacking together raced in session 21).
set -u
B=gpu-bundle-next; bash $B/unpack.sh
export MET_HOME=/tmp/met-home-shared; mkdir -p $MET_HOME
R=/tmp/r1; rm -rf $R; mkdir -p $R
(bash $B/run.sh $R/a lib ops fixtures graphs invariance generate > $R/a.out 2>&1) &
sleep 60
(bash $B/run.sh $R/b gate gatestate > $R/b.out 2>&1) &
sleep 15
(bash $B/run.sh $R/c gatekv gatefp8 compare > $R/c.out 2>&1) &
for i in $(seq ${LIMIT:-520}); do [ -n "$(jobs -r)" ] || break; sleep 1; done
echo "waited $i s"
for f in a b c; do echo "######## $f"; sed -n '/======== met GPU summary/,/^$/p' $R/$f.out; grep -E "^== .*FAIL" -A12 $R/$f.out | head -40; done
tar czf $OUT/r1.tgz -C $R .
