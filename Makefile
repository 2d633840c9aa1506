# robot_sdf developer entry points (GNU make).
#
#   make venv         build .venv: pinned deps, robot_sdf_interfaces (CMake), robot_sdf (editable)
#   make test         run the pytest suite (test/colcon_test.py builds build/colcon_ws with colcon)
#   make colcon       build the ROS 2 workspace build/colcon_ws (both packages) with colcon
#   make demo         run the demo (robot_sdf.examples.demo)
#   make arm-demo     run the arm demo (robot_sdf.examples.arm_demo: Franka Panda, gradient MPC) into arm_out/
#   make bench        install the benchmark extras and run the benchmarks (python -m bench)
#   make soak         load + fault + memory checks of a real node (bench/soak.py; not in `make test`)
#                     SOAK_DURATION=<s> (default 60) sets the load phase, SOAK_ARGS passes more options
#   make interfaces   rebuild and reinstall robot_sdf_interfaces into the venv
#   make clean        remove build outputs and generated files (keeps .venv)
#   make distclean    clean + remove .venv
#
# Every step is guarded by a stamp file inside the venv, so re-running is a no-op when
# nothing changed; a failed step leaves its stamp untouched and is retried next time.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Interpreter that creates the venv; the ROS 2 wheels are cp311-only.
PYTHON ?= python3
PIP_VERSION := 24.3.1

# DDS discovery stays on loopback for everything started from here (tests, demo, bench).
export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST

IFACE_DIR := robot_sdf_interfaces
IFACE_SRCS := $(wildcard $(IFACE_DIR)/msg/*.msg $(IFACE_DIR)/srv/*.srv) \
              $(IFACE_DIR)/CMakeLists.txt $(IFACE_DIR)/package.xml $(IFACE_DIR)/pyproject.toml

DEPS_STAMP := $(VENV)/.robot_sdf-deps-stamp
IFACE_STAMP := $(VENV)/.robot_sdf-interfaces-stamp
STAMP := $(VENV)/.robot_sdf-stamp
BENCH_STAMP := $(VENV)/.robot_sdf-bench-stamp

.PHONY: venv test colcon demo arm-demo bench soak interfaces clean distclean

venv: $(STAMP)

$(PY):
	@echo "[setup] creating virtual environment $(VENV) with $(PYTHON) ..."
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { \
	  echo "error: $(PYTHON) is not Python 3.11 (the ROS 2 wheels are cp311); run 'make PYTHON=python3.11 ...'" >&2; \
	  exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip==$(PIP_VERSION)

$(DEPS_STAMP): requirements.txt requirements-colcon.txt | $(PY)
	@echo "[setup] 1/3 installing pinned Python dependencies (torch, warp, ROS 2 wheels, colcon) ..."
	$(PIP) install -r requirements.txt
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
	@echo "[setup] done: $(VENV) is ready"

test: venv
	$(PY) -m pytest -q test

# The workspace build of the README (`colcon build --paths src/robot_sdf src/robot_sdf/robot_sdf_interfaces`)
# from this checkout, into build/colcon_ws/{build,install,log}. Incremental: a few seconds when nothing
# changed. test/colcon_test.py runs the same command and then starts sdf_server from the install.
COLCON_WS := build/colcon_ws
colcon: venv
	mkdir -p $(COLCON_WS)
	cd $(COLCON_WS) && env -u AMENT_PREFIX_PATH -u CMAKE_PREFIX_PATH -u COLCON_PREFIX_PATH PATH="$(abspath $(VENV))/bin:$$PATH" \
	  $(abspath $(PY)) -m colcon --log-base log build --paths $(CURDIR) $(CURDIR)/$(IFACE_DIR) \
	  --build-base build --install-base install

demo: venv
	$(PY) -m robot_sdf.examples.demo

arm-demo: venv
	$(PY) -m robot_sdf.examples.arm_demo $(ARM_DEMO_ARGS)

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
	rm -rf $(IFACE_DIR)/build build install log dist .pytest_cache demo_out arm_out bench_out
	rm -rf *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
