# The two commands: `make demo` and `make test`. Both install what is missing first.
BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
MAKEFLAGS += --no-print-directory
# The OpenAI Agents example's packages, installed from its lock file (again only when the lock changes).
OPENAI_AGENTS_MODULES := examples/js/openai_agents/node_modules/.package-lock.json

.PHONY: all deps build test demo install bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps $(OPENAI_AGENTS_MODULES)
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

$(OPENAI_AGENTS_MODULES): examples/js/openai_agents/package-lock.json
	@command -v npm >/dev/null || { echo "make: npm not found: install Node.js >= 20 with npm (Debian: apt-get install nodejs npm)" >&2; exit 1; }
	@npm ci --prefix examples/js/openai_agents --no-audit --no-fund --loglevel=error

# The cgroup v2 test boots Debian's kernel in a virtual machine (tests/vm).
test: build
	@scripts/test-kernel.sh $(BUILD)/test-kernel
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@examples/demo.sh $(BUILD)

bench: build
	@$(BUILD)/bench/step_latency
	@$(BUILD)/bench/sandbox_start
	@$(BUILD)/bench/tool_call
	@$(BUILD)/bench/concurrency
	@$(BUILD)/bench/suspended
	@$(BUILD)/bench/throughput
	@$(BUILD)/bench/live_runs
	@$(BUILD)/bench/fanout
	@$(BUILD)/bench/replay
	@$(BUILD)/bench/conversation
	@$(BUILD)/bench/scale_out

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	@rm -rf $(BUILD) .cairn
