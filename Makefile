# robot_sdf developer entry points (GNU make).
#
#   make venv         build .venv: pinned deps, robot_sdf_interfaces (CMake), robot_sdf (editable)
#   make test         run the pytest suite, modules in parallel (TEST_WORKERS; test/colcon_test.py builds
#                     a colcon workspace under build/)
#   make test-ros     run the ROS-facing tests only (node, client, lifecycle, tf, colcon, launch, reliability)
#   make test-warp-oldest  run the core tests (every test file that needs no ROS) on the oldest Warp
#                     robot_sdf supports (requirements/warp-oldest.txt), installed beside the venv's pin
#   make colcon       build the ROS 2 workspace build/colcon_ws-<venv name> (both packages) with colcon
#   make demo         run the demo (robot_sdf.examples.demo)
#   make arm-demo     run the arm demo (robot_sdf.examples.arm_demo: Franka Panda, gradient MPC) into arm_out/
#   make perception-demo  a simulated depth camera is all sdf_server knows; the Panda's MPC avoids a box only
#                     the camera sees (robot_sdf.examples.perception_demo) into perception_out/
#   make bench        install the benchmark extras and run the benchmarks (python -m bench)
#   make soak         load + fault + memory checks of a real node (bench/soak.py; not in `make test`)
#                     SOAK_DURATION=<s> (default 60) sets the load phase, SOAK_ARGS passes more options
#   make interfaces   rebuild and reinstall robot_sdf_interfaces into the venv
#   make clean        remove build outputs and generated files (keeps the venv)
#   make distclean    clean + remove the venv
#
# ROS_DISTRO=jazzy (default, the LTS) or kilted picks the ROS 2 wheels (requirements/<distro>.txt);
# VENV (default .venv) picks the venv. A venv holds one distribution, recorded in
# $(VENV)/.robot_sdf-ros-distro; naming a venv of the other one is an error, so keep one venv per
# distribution, e.g. `make test ROS_DISTRO=kilted VENV=.venv-kilted` beside the default .venv.
#
# Every step is guarded by a stamp file inside the venv, so re-running is a no-op when
# nothing changed; a failed step leaves its stamp untouched and is retried next time.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Interpreter that creates the venv; the ROS 2 wheels are cp311-only.
PYTHON ?= python3
PIP_VERSION := 24.3.1

ROS_DISTRO ?= jazzy
ROS_DISTROS := jazzy kilted
# Tests and tools started from here see the distribution too (test/distro_test.py compares it).
export ROS_DISTRO
DISTRO_RECORD := $(VENV)/.robot_sdf-ros-distro
DISTRO_REQUIREMENTS := requirements/$(ROS_DISTRO).txt

# DDS discovery stays on loopback for everything started from here (tests, demo, bench).
export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST

# Refuse a distribution other than the venv's before anything runs: installing one distribution's
# pins over the other's would leave a mixed venv. A venv without a record (built before the
# record existed) is known by its ros-rclpy, whose version is pinned in exactly one
# requirements/<distro>.txt.
GOALS := $(or $(MAKECMDGOALS),venv)
ifneq ($(filter-out clean distclean,$(GOALS)),)
  ifeq ($(filter $(ROS_DISTRO),$(ROS_DISTROS)),)
    $(error ROS_DISTRO=$(ROS_DISTRO) is not one of: $(ROS_DISTROS); run 'make $(GOALS) ROS_DISTRO=jazzy')
  endif
  VENV_DISTRO := $(shell \
    if [ -f '$(DISTRO_RECORD)' ]; then cat '$(DISTRO_RECORD)'; \
    elif [ -x '$(PY)' ]; then \
      v=$$('$(PY)' -c 'from importlib.metadata import version; print(version("ros-rclpy"))' 2>/dev/null) && \
      for d in $(ROS_DISTROS); do grep -qx "ros-rclpy==$$v" requirements/$$d.txt && echo $$d; done; \
    fi)
  ifneq ($(VENV_DISTRO),)
    ifneq ($(VENV_DISTRO),$(ROS_DISTRO))
      $(error $(VENV) holds ROS 2 $(VENV_DISTRO), not $(ROS_DISTRO): run 'make $(GOALS) ROS_DISTRO=$(VENV_DISTRO)' to use it, or 'make $(GOALS) VENV=.venv-$(ROS_DISTRO)' for a $(ROS_DISTRO) venv beside it)
    endif
  endif
endif

IFACE_DIR := robot_sdf_interfaces
IFACE_SRCS := $(wildcard $(IFACE_DIR)/msg/*.msg $(IFACE_DIR)/srv/*.srv) \
              $(IFACE_DIR)/CMakeLists.txt $(IFACE_DIR)/package.xml $(IFACE_DIR)/pyproject.toml

DEPS_STAMP := $(VENV)/.robot_sdf-deps-stamp
IFACE_STAMP := $(VENV)/.robot_sdf-interfaces-stamp
STAMP := $(VENV)/.robot_sdf-stamp
BENCH_STAMP := $(VENV)/.robot_sdf-bench-stamp

.PHONY: venv test test-ros test-warp-oldest colcon demo arm-demo perception-demo bench soak interfaces clean distclean

venv: $(STAMP)

$(PY):
	@echo "[setup] creating virtual environment $(VENV) with $(PYTHON) ..."
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { \
	  echo "error: $(PYTHON) is not Python 3.11 (the ROS 2 wheels are cp311); run 'make PYTHON=python3.11 ...'" >&2; \
	  exit 1; }
	$(PYTHON) -m venv $(VENV)
	echo $(ROS_DISTRO) > $(DISTRO_RECORD)
	$(PIP) install --quiet --upgrade pip==$(PIP_VERSION)

# The record is written again here for a venv that predates it (the check above found its
# distribution from ros-rclpy).
$(DEPS_STAMP): requirements.txt requirements/common.txt $(DISTRO_REQUIREMENTS) requirements-colcon.txt | $(PY)
	@echo "[setup] 1/3 installing pinned Python dependencies (torch, warp, ROS 2 $(ROS_DISTRO) wheels, colcon) ..."
	echo $(ROS_DISTRO) > $(DISTRO_RECORD)
	$(PIP) install -r $(DISTRO_REQUIREMENTS)
	$(PIP) install --no-deps -r requirements-colcon.txt
	@touch $@

# The package version never changes when a .msg/.srv does, hence --force-reinstall; --no-deps
# keeps that from reinstalling every dependency. Build isolation would hide ament_package and
# the CMake configs of the ros-* wheels from CMake. The build directory is wiped first so that
# no CMake cache from another venv or another checkout path is reused.
$(IFACE_STAMP): $(DEPS_STAMP) $(IFACE_SRCS)
	@echo "[setup] 2/3 building robot_sdf_interfaces (CMake + rosidl code generation, about 15-60 s) ..."
	rm -rf $(IFACE_DIR)/build
	$(PIP) install --no-build-isolation --no-deps --force-reinstall ./$(IFACE_DIR)
	@touch $@

# Editable install: `import robot_sdf` from this checkout and console scripts in $(VENV)/bin.
# setup.cfg sends scripts to lib/robot_sdf for colcon (`setup.py develop/install`); pip builds
# an editable wheel instead and puts the scripts into $(VENV)/bin, so no override is needed.
$(STAMP): $(IFACE_STAMP) setup.py setup.cfg
	@echo "[setup] 3/3 installing robot_sdf (editable) ..."
	$(PIP) install --no-deps --no-build-isolation -e .
	@$(PY) -c "from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose; \
	  from robot_sdf_interfaces.srv import EvaluateSphereCost, EvaluateSweptSphereCost, QuerySignedDistance"
	@touch $@
	@echo "[setup] done: $(VENV) is ready (ROS 2 $(ROS_DISTRO))"

PYTEST_ARGS ?= -q
# Test modules run in parallel worker processes (pytest-xdist), a whole module per worker so that
# its fixtures (a node, a colcon workspace) are built once; each worker reserves ROS domain ids
# of its own (server_process.reserve_domain_id). One worker per core, at most 4;
# TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)
test: venv
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS) test

# The tests that exercise ROS 2 itself (rclpy, the interfaces, the node, colcon, the launch file),
# which CI runs on each distribution; test/distro_test.py checks the venv's rclpy first.
ROS_TESTS := test/distro_test.py $(sort $(wildcard test/ros_*_test.py)) test/lifecycle_test.py \
             test/colcon_test.py test/launch_test.py test/server_process_test.py test/health_test.py
test-ros: venv
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS) $(ROS_TESTS)

# The core tests on the oldest supported Warp: that release goes into $(VENV)/warp-oldest (pip
# --target, without dependencies: Warp has none but numpy) and comes first on PYTHONPATH, so that
# the venv's pin stays as it is. Core tests: the test files that import nothing of ROS (the same
# selection as bench/gpu_session.sh's). cuda_build_test is left out: its cold cubin build of three
# architectures takes 5-11 min (it runs in `make test` on the pin).
WARP_OLDEST := $(shell sed -n 's/^warp-lang==//p' requirements/warp-oldest.txt)
WARP_OLDEST_DIR := $(VENV)/warp-oldest
WARP_OLDEST_STAMP := $(WARP_OLDEST_DIR)/.robot_sdf-stamp
CORE_TESTS = $(filter-out test/cuda_build_test.py,$(shell grep -L -E "rclpy|ros_helpers|robot_sdf\.ros|launch_testing|colcon" test/*_test.py))
$(WARP_OLDEST_STAMP): $(STAMP) requirements/warp-oldest.txt
	@echo "[setup] installing warp-lang $(WARP_OLDEST) into $(WARP_OLDEST_DIR) ..."
	rm -rf $(WARP_OLDEST_DIR)
	$(PIP) install --quiet --no-deps --target $(WARP_OLDEST_DIR) -r requirements/warp-oldest.txt
	@touch $@
test-warp-oldest: $(WARP_OLDEST_STAMP)
	PYTHONPATH=$(abspath $(WARP_OLDEST_DIR)) ROBOT_SDF_EXPECT_WARP=$(WARP_OLDEST) \
	  $(PY) -m pytest $(XDIST) $(PYTEST_ARGS) $(CORE_TESTS)

# The workspace build of docs/install.md (`colcon build --paths src/robot_sdf src/robot_sdf/robot_sdf_interfaces`)
# from this checkout, into build/colcon_ws-<venv name>/{build,install,log}: one workspace per venv,
# since CMake caches the interpreter it found. Incremental: a few seconds when nothing changed.
# test/colcon_test.py builds the same workspace and runs every console script from the install.
COLCON_WS := build/colcon_ws-$(patsubst .%,%,$(notdir $(abspath $(VENV))))
colcon: venv
	@if [ "$$(cat $(COLCON_WS)/.python 2>/dev/null)" != "$(abspath $(PY))" ]; then rm -rf $(COLCON_WS); fi
	mkdir -p $(COLCON_WS)
	echo "$(abspath $(PY))" > $(COLCON_WS)/.python
	cd $(COLCON_WS) && env -u AMENT_PREFIX_PATH -u CMAKE_PREFIX_PATH -u COLCON_PREFIX_PATH PATH="$(abspath $(VENV))/bin:$$PATH" \
	  $(abspath $(PY)) -m colcon --log-base log build --paths $(CURDIR) $(CURDIR)/$(IFACE_DIR) \
	  --build-base build --install-base install

demo: venv
	$(PY) -m robot_sdf.examples.demo

arm-demo: venv
	$(PY) -m robot_sdf.examples.arm_demo $(ARM_DEMO_ARGS)

perception-demo: venv
	$(PY) -m robot_sdf.examples.perception_demo $(PERCEPTION_DEMO_ARGS)

$(BENCH_STAMP): $(STAMP) requirements-bench.txt
	@echo "[setup] installing benchmark extras (open3d-cpu) ..."
	$(PIP) install -r requirements-bench.txt
	@touch $@

bench: $(BENCH_STAMP)
	$(PY) -m bench

SOAK_DURATION ?= 60
soak: venv
	$(PY) -m bench.soak --duration $(SOAK_DURATION) $(SOAK_ARGS)

interfaces:
	rm -f $(IFACE_STAMP)
	$(MAKE) venv

clean:
	rm -rf $(IFACE_DIR)/build build install log dist .pytest_cache demo_out arm_out perception_out bench_out
	rm -rf *.egg-info
	find . -path ./$(VENV) -prune -o -path './.venv*' -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
