#!/bin/bash
# stage.sh K [last]: copies .peer/cK into /tmp/peer-stage; with "last", installs.
set -u
mkdir -p /tmp/peer-stage && cp -r .peer/c$1/. /tmp/peer-stage/ && echo "staged c$1: $(du -sh /tmp/peer-stage | cut -f1)"
if [ "${2:-}" = last ]; then bash /tmp/peer-stage/install.sh > /tmp/peer-install.log 2>&1; echo "install rc=$?"; tail -3 /tmp/peer-install.log; fi
