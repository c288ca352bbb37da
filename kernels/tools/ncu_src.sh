#!/bin/bash
# Temporary: profile one ws launch (B=64/512) with per-instruction stall sampling; CSVs to $OUT.
set -x
cd "$(dirname "$0")/.." && export PYTHONPATH=$PWD
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for tag in ${TAGS:-full}; do
  case $tag in full|k1024) d=0;; nogather) d=2;; noconv) d=1;; esac
  TOPK=512; [ $tag = k1024 ] && TOPK=1024
  WS_DIAG=$d timeout 240 $NCU --clock-control none -k regex:_sparse_decode_ws --launch-skip 3 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis_Tables \
    --section SpeedOfLight --section Occupancy --section LaunchStats -f -o $OUT/$tag python tools/prof_one.py ${VARIANT:-ws} 64 8 64 $TOPK >/dev/null 2>&1
  $NCU --import $OUT/$tag.ncu-rep --page source --csv --print-source sass > $OUT/${tag}_src.csv 2>$OUT/${tag}_src.err
  $NCU --import $OUT/$tag.ncu-rep --page details --csv > $OUT/${tag}_details.csv 2>&1
  ls -la $OUT; head -c 600 $OUT/${tag}_src.csv; grep -i "duration\|Issue Slots\|Warp Cycles Per Issued\|Bank" $OUT/${tag}_details.csv | head -20
done
