# The README's two commands, kept thin: install missing Debian packages, configure and
# build with CMake, then run. `make demo` trains on Fashion-MNIST (`make gpt-demo`: a GPT on
# the Python standard library's sources); `make test` runs ctest in both configurations:
# $(BUILD) (CUDA AUTO: on when nvcc, cuDNN and NCCL are found; every suite, the gpu one
# skipping visibly without a GPU) and $(BUILD_CPU) (RINGTRAIN_CUDA=OFF: the unit tests and
# the CLI/bad-input e2e tests, which are what differs without CUDA, built and run; `make
# build-cpu` compiles everything of that configuration).
MAKEFLAGS += --no-print-directory
BUILD ?= build
BUILD_CPU ?= build-cpu
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

.PHONY: all deps configure build configure-cpu build-cpu install demo gpt-demo test test-cpu \
  test-multinode format clean

all: build

deps:
	@tools/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -E '✓|✗' $(BUILD).configure.log | sed 's/^-- //'

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

configure-cpu: deps
	@cmake -S . -B $(BUILD_CPU) -DCMAKE_BUILD_TYPE=Release -DRINGTRAIN_CUDA=OFF $(CMAKE_FLAGS) \
	  > $(BUILD_CPU).configure.log 2>&1 || { cat $(BUILD_CPU).configure.log; exit 1; }

build-cpu: configure-cpu
	@cmake --build $(BUILD_CPU) -j$(JOBS)

# The binary, the libraries an op needs, their headers, the shipped models and the CMake
# package (find_package(ringtrain)) under $(PREFIX); docs/building.md.
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

demo: build
	@tools/demo.sh

gpt-demo: build
	@tools/gpt-demo.sh

test: build test-cpu
	@cd $(BUILD) && ctest --output-on-failure --timeout 900

test-cpu: configure-cpu
	@cmake --build $(BUILD_CPU) -j$(JOBS) --target ringtrain unit_tests
	@echo "CPU-only configuration ($(BUILD_CPU)): unit tests, CLI and bad-input e2e tests"
	@cd $(BUILD_CPU) && ctest --output-on-failure --timeout 900 -L unit
	@cd $(BUILD_CPU) && ctest --output-on-failure --timeout 900 \
	  -R '^(e2e_prepare_data|e2e_cli|e2e_bad_input|gpu_not_built)$$'

# The multinode label alone (2 emulated nodes; as root; part of `make test` too): 3-4 minutes
# on a busy 2-core machine.
test-multinode: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 900 -L multinode

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) $(BUILD).configure.log $(BUILD_CPU) $(BUILD_CPU).configure.log
