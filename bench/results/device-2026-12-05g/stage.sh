#!/bin/bash
# How vLLM 0.26.0 reached the H200 in this lease (../../../../shared/peers/vllm/README.md makes
# .peer/c1..c11): the tracked tree is now too large for a 31 MB chunk beside it (64 MiB a run),
# so each chunk went as a tar in 16 MiB pieces, one run a piece, back to back:
#   here:  for k in $(seq 11); do tar cf - -C .peer/c$k . | split -b 16m - .peer/h/c$k.tar.; done
#   there: run with carry [".peer/h/cK.tar.aX"]:
#            cat .peer/h/cK.tar.aa  > /tmp/cK.tar                      (first piece)
#            cat .peer/h/cK.tar.ab >> /tmp/cK.tar && mkdir -p /tmp/peer-stage \
#              && tar xf /tmp/cK.tar -C /tmp/peer-stage && rm /tmp/cK.tar (last piece)
#          and after c11: bash /tmp/peer-stage/install.sh
# 21 runs of 3 to 5 s held each; install 25 s.
set -eu
k=$1 piece=$2 last=${3:-}
if [ "$piece" = aa ]; then cat .peer/h/c$k.tar.aa > /tmp/c$k.tar; else cat .peer/h/c$k.tar.$piece >> /tmp/c$k.tar; fi
if [ -n "$last" ]; then mkdir -p /tmp/peer-stage && tar xf /tmp/c$k.tar -C /tmp/peer-stage && rm /tmp/c$k.tar; fi
