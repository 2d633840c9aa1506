#!/usr/bin/env bash
# The GPU checks in one device call: prepared on the CPU machine, run on the GPU one.
#
#   here:  bash ../shared/gpu/prepare.sh                                   # warp for the image
#          .venv/bin/python -m bench.real_meshes --pack .gpu2/meshes.npz   # the image has no rtb-data
#   there: bash .gpu2/run.sh bash bench/gpu_session.sh                     # carry [".gpu2"]
#
# 0. robot_sdf's kernel modules loaded on the device (timed), then the CUDA hazards
#    (bench/gpu_hazards.py; its stream check under compute-sanitizer where there is one); 1. every
#    CUDA-parametrised test of the core (-k cuda), test files that need ROS left out (the image
#    has none) and cuda_build_test too (a cold cubin build for the CPU machine); 2. the GPU figures:
#    `python -m bench --only core --device cuda` with the tables the GPU work asks for. Each part
#    has a time limit (seconds: LOAD_S, HAZARDS_S, SANITIZER_S, TESTS_S, BENCH_S) and all of them
#    share TOTAL_S (default 540, under the device's 600 s a call): a part gets what is left when
#    less is, and one with under 20 s left is skipped and says so. What each part printed goes
#    under $OUT: load.txt, hazards.txt, sanitizer.txt, tests.txt, bench.md, bench.err.
#    A dry run on a CPU machine: PYTHON=.venv/bin/python DEVICE=cpu BENCH_ARGS=--quick.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-session}
mkdir -p "$out"
py=${PYTHON:-python3}
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
deadline=$((SECONDS + ${TOTAL_S:-540}))
# budget NAME WANT: the seconds part NAME may take (WANT, or what is left before the deadline),
# or nothing (and a line saying so) when under 20 s are left.
budget() {
  local left=$((deadline - SECONDS - 5))
  if [ "$left" -lt 20 ]; then echo "$1: skipped - ${left} s left of TOTAL_S" >&2; return 1; fi
  echo $(( $2 < left ? $2 : left ))
}
if [ -f .gpu2/meshes.npz ]; then
  export ROBOT_SDF_MESH_PACK=$PWD/.gpu2/meshes.npz
fi
# The core test files (the selection of the Makefile's CORE_TESTS), without cuda_build_test: its
# cold cubin build of three architectures for the CPU machine's cache takes 5-11 min and fills
# no runtime kernel cache here; the kernels compile for this card when loaded below.
core_tests=$(grep -L -E "rclpy|ros_helpers|robot_sdf\.ros|launch_testing|colcon" test/*_test.py | grep -v cuda_build_test)
# Load robot_sdf's Warp modules on the device once, timed, so that the tests' limit is spent on tests.
load_device=${DEVICE:-cuda}; [ "$load_device" = cuda ] && load_device=cuda:0
t=$(budget load "${LOAD_S:-180}") && timeout "$t" "$py" -c "import sys, time, torch, robot_sdf; from robot_sdf.launch import warp_device; \
t = time.time(); warp_device(torch.device(sys.argv[1])); print(f'kernel modules loaded on {sys.argv[1]} in {time.time() - t:.1f} s')" \
  "$load_device" > "$out/load.txt" 2>&1
echo "load: exit $? - $(tail -n 1 "$out/load.txt")"
# The CUDA hazards (bench/gpu_hazards.py), then the stream check again under compute-sanitizer
# where the image has it (memcheck: out-of-bounds and freed-memory reads of the kernels).
t=$(budget hazards "${HAZARDS_S:-90}") && timeout "$t" "$py" -m bench.gpu_hazards > "$out/hazards.txt" 2>&1
echo "hazards: exit $? - $(grep -c '^PASS' "$out/hazards.txt") passed, $(tail -n 1 "$out/hazards.txt")"
if command -v compute-sanitizer > /dev/null; then
  t=$(budget sanitizer "${SANITIZER_S:-90}") && timeout "$t" compute-sanitizer --tool memcheck --print-limit 20 \
    "$py" -m bench.gpu_hazards --only streams > "$out/sanitizer.txt" 2>&1
  echo "sanitizer: exit $? - $(grep -E 'ERROR SUMMARY' "$out/sanitizer.txt" | tail -n 1)"
else
  echo "sanitizer: skipped - compute-sanitizer is not on this image" | tee "$out/sanitizer.txt"
fi
t=$(budget tests "${TESTS_S:-200}") && timeout "$t" "$py" -m pytest -q -rfEs -p no:cacheprovider --continue-on-collection-errors \
  -k cuda $core_tests > "$out/tests.txt" 2>&1
echo "tests: exit $? - $(tail -n 1 "$out/tests.txt")"
# shellcheck disable=SC2086  # BENCH_ARGS holds separate words
t=$(budget bench "${BENCH_S:-240}") && timeout "$t" "$py" -m bench --only core --device "${DEVICE:-cuda}" ${BENCH_ARGS:-} \
  --tables "${TABLES:-call_overhead,standard_table,mppi_batch,swept_table,real_mesh_table,triangle_scaling,kernel_sets,perception_fusion}" \
  > "$out/bench.md" 2> "$out/bench.err"
echo "bench: exit $? - $(grep -c '^|' "$out/bench.md") table rows in $out/bench.md"
