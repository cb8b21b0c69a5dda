# The two commands: `make demo` and `make test`. Both install what is missing first.
BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
MAKEFLAGS += --no-print-directory
# The OpenAI Agents example's packages, installed from its lock file (again only when the lock changes).
OPENAI_AGENTS_MODULES := examples/js/openai_agents/node_modules/.package-lock.json

.PHONY: all deps configure build test test-sanitize fuzz deb demo install bench clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps $(OPENAI_AGENTS_MODULES)
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

$(OPENAI_AGENTS_MODULES): examples/js/openai_agents/package-lock.json
	@command -v npm >/dev/null || { echo "make: npm not found: install Node.js >= 20 with npm (Debian: apt-get install nodejs npm)" >&2; exit 1; }
	@npm ci --prefix examples/js/openai_agents --no-audit --no-fund --loglevel=error

# The cgroup v2 test boots Debian's kernel in a virtual machine (tests/vm).
# deb_test installs the package `make deb` made into a clean Debian root.
test: build deb
	@scripts/test-kernel.sh $(BUILD)/test-kernel
	@cd $(BUILD) && CAIRN_DEB="$$(ls $(CURDIR)/$(DEB_BUILD)/cairn_*.deb)" ctest --output-on-failure -j $(JOBS)

# The host's tests under sanitizers, each build in a folder of its own
# (tests/sanitized.cmake says which tests): AddressSanitizer with
# UndefinedBehaviorSanitizer, then ThreadSanitizer. The first folder also
# holds the fuzz targets (tests/fuzz), which `make fuzz` runs from their seed
# corpus (FUZZ_SECONDS each).
ASAN_BUILD ?= $(BUILD)-asan
TSAN_BUILD ?= $(BUILD)-tsan
FUZZ_SECONDS ?= 20
CONFIGURE_ASAN = cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_SANITIZE=address,undefined \
  -DCAIRN_FUZZ=ON -DCAIRN_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null

test-sanitize: deps $(OPENAI_AGENTS_MODULES)
	@$(CONFIGURE_ASAN)
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target sanitized
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L sanitized
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_SANITIZE=thread >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target sanitized
	@cd $(TSAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L sanitized

# cairn_VERSION_amd64.deb in $(DEB_BUILD) (cmake/package.cmake): a Release
# build for the prefix /usr, without tests and benchmarks.
DEB_BUILD ?= $(BUILD)-deb
deb: deps
	@cmake -S . -B $(DEB_BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DBUILD_TESTING=OFF \
	  -DCAIRN_BENCH=OFF >/dev/null
	@cmake --build $(DEB_BUILD) -j $(JOBS)
	@cd $(DEB_BUILD) && cpack -G DEB >/dev/null && ls $(CURDIR)/$(DEB_BUILD)/cairn_*.deb

fuzz: deps
	@$(CONFIGURE_ASAN)
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target fuzzers
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L fuzz

# The demo's programs only (cairn, the example agents, the SDKs, the mock
# model): the tests are built by `make test`.
demo: configure
	@cmake --build $(BUILD) -j $(JOBS) --target demo_programs
	@examples/demo.sh $(BUILD)

bench: build
	@$(BUILD)/bench/step_latency
	@$(BUILD)/bench/sandbox_start
	@$(BUILD)/bench/tool_call
	@$(BUILD)/bench/concurrency
	@$(BUILD)/bench/suspended
	@$(BUILD)/bench/throughput
	@$(BUILD)/bench/gc
	@$(BUILD)/bench/stop
	@$(BUILD)/bench/checkpoint
	@$(BUILD)/bench/live_runs
	@$(BUILD)/bench/fanout
	@$(BUILD)/bench/replay
	@$(BUILD)/bench/conversation
	@$(BUILD)/bench/scale_out
	@$(BUILD)/bench/sim

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(DEB_BUILD) .cairn
