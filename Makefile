# The README's two commands, kept thin: install missing Debian packages, configure and
# build with CMake, then run. `make demo` trains on Fashion-MNIST; `make test` runs ctest.
MAKEFLAGS += --no-print-directory
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test format clean

all: build

deps:
	@tools/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -E '✓|✗' $(BUILD).configure.log | sed 's/^-- //'

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	@tools/demo.sh

test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 900

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
