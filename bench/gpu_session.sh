#!/usr/bin/env bash
# The GPU checks in one device call: prepared on the CPU machine, run on the GPU one.
#
#   here:  bash ../shared/gpu/prepare.sh                                   # warp for the image
#          .venv/bin/python -m bench.real_meshes --pack .gpu2/meshes.npz   # the image has no rtb-data
#   there: bash .gpu2/run.sh bash bench/gpu_session.sh                     # carry [".gpu2"]
#
# 0. robot_sdf's kernel modules loaded on the device (timed); 1. every CUDA-parametrised test of
#    the core (-k cuda), test files that need ROS left out (the image has none) and
#    cuda_build_test too (a cold cubin build for the CPU machine); 2. the GPU figures:
#    `python -m bench --only core --device cuda` with the tables the GPU work asks for. Each part
#    has a time limit (seconds: LOAD_S, TESTS_S, BENCH_S), so the call ends within the device's;
#    what each part printed goes under $OUT: load.txt, tests.txt, bench.md, bench.err. A dry run on a CPU machine: PYTHON=.venv/bin/python DEVICE=cpu BENCH_ARGS=--quick.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-session}
mkdir -p "$out"
py=${PYTHON:-python3}
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
if [ -f .gpu2/meshes.npz ]; then
  export ROBOT_SDF_MESH_PACK=$PWD/.gpu2/meshes.npz
fi
# The core test files (the selection of the Makefile's CORE_TESTS), without cuda_build_test: its
# cold cubin build of three architectures for the CPU machine's cache takes 5-11 min and fills
# no runtime kernel cache here; the kernels compile for this card when loaded below.
core_tests=$(grep -L -E "rclpy|ros_helpers|robot_sdf\.ros|launch_testing|colcon" test/*_test.py | grep -v cuda_build_test)
# Load robot_sdf's Warp modules on the device once, timed, so that the tests' limit is spent on tests.
load_device=${DEVICE:-cuda}; [ "$load_device" = cuda ] && load_device=cuda:0
timeout "${LOAD_S:-240}" "$py" -c "import sys, time, torch, robot_sdf; from robot_sdf.launch import warp_device; \
t = time.time(); warp_device(torch.device(sys.argv[1])); print(f'kernel modules loaded on {sys.argv[1]} in {time.time() - t:.1f} s')" \
  "$load_device" > "$out/load.txt" 2>&1
echo "load: exit $? - $(tail -n 1 "$out/load.txt")"
timeout "${TESTS_S:-300}" "$py" -m pytest -q -rfEs -p no:cacheprovider --continue-on-collection-errors \
  -k cuda $core_tests > "$out/tests.txt" 2>&1
echo "tests: exit $? - $(tail -n 1 "$out/tests.txt")"
# shellcheck disable=SC2086  # BENCH_ARGS holds separate words
timeout "${BENCH_S:-360}" "$py" -m bench --only core --device "${DEVICE:-cuda}" ${BENCH_ARGS:-} \
  --tables "${TABLES:-call_overhead,standard_table,mppi_batch,swept_table,real_mesh_table,triangle_scaling}" \
  > "$out/bench.md" 2> "$out/bench.err"
echo "bench: exit $? - $(grep -c '^|' "$out/bench.md") table rows in $out/bench.md"
