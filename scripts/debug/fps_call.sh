# One device call for the farthest-point kernels (fps_probe.py): variant builds in parallel, checks,
# timings, and optionally compute-sanitizer (SANITIZE=1) and an ncu source-level profile
# (PROFILE=fps|fps1m: prof_sass.csv.gz, per-instruction warp-stall samples, and prof_details.txt).
# VARIANTS="name=nvcc flags;..." (default: one build of the file as it is, "v0=").
# Used through the device tool:  bash scripts/debug/fps_call.sh
cd scripts/debug; export PYTHONUNBUFFERED=1 MAX_JOBS=8
IFS=';' read -r -a specs <<<"${VARIANTS:-v0=}"
t0=$(date +%s)
for spec in "${specs[@]}"; do FPS_PROBE_NVCC_FLAGS="${spec#*=}" python fps_probe.py build > $OUT/build_${spec%%=*}.log 2>&1 & done; wait
echo "builds: $(( $(date +%s) - t0 )) s"; tail -n 3 $OUT/build_*.log | grep -i error
for spec in "${specs[@]}"; do echo "== $spec"; FPS_PROBE_NVCC_FLAGS="${spec#*=}" python fps_probe.py check time 2>&1 | grep -v "^check [a-z]\|pointops:" | tail -4; done
if [ -n "${SANITIZE:-}" ]; then for tool in memcheck racecheck; do timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 python fps_probe.py sanitize > $OUT/san_$tool.log 2>&1; echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' $OUT/san_$tool.log | tr '\n' ' ')"; done; fi
if [ -n "${PROFILE:-}" ]; then
  ncu --set full --import-source yes -k regex:farthest --launch-skip 1 --launch-count 1 -o $OUT/prof python fps_probe.py profile $PROFILE > $OUT/ncu.log 2>&1
  ncu -i $OUT/prof.ncu-rep --page source --csv --print-source sass | gzip > $OUT/prof_sass.csv.gz; ncu -i $OUT/prof.ncu-rep --page details > $OUT/prof_details.txt 2>&1; rm -f $OUT/prof.ncu-rep
fi
