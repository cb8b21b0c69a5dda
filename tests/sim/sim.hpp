// The deterministic simulator (issue 41, in the manner of FoundationDB's
// simulation and TigerBeetle's VOPR), first layer: the real ledger, the
// real in-memory journal and the engine's real rules for taking a run
// (engine/liveness.hpp's owner check, wait_is_over, find_in_doubt, the
// run's kept state read through run_journal, the attempt's journal port),
// in one thread, on a virtual clock, every choice drawn from one seeded
// PRNG. What stands in for the rest is a model: the workers' loops (take a
// run, drive its agent one effect at a time, renew a lease) and the agents
// (scripted steps, at-most-once and idempotent tools, sleeps, signals).
// With --driver real the engine's attempt driver stands in for that model
// (options::driver); the scheduler is not in it yet.
//
// Each run has a workspace in memory (sim_workspace.hpp) that its agent
// writes as it executes a step, long before the step commits; the attempt
// keeps it through the engine's checkpoint code (run_journal's
// watch_workspace, checkpoint_chain, the ledger), which also rolls it back
// after a crash. Runs are forked at random steps through `cairn fork`'s
// journal code (engine::write_fork), forks of forks too.
//
// Faults, at any effect boundary: a worker crashes (restarts from the
// journal), pauses past its lease, comes back under the same id while its
// old self is paused (a zombie), the machine loses power (everything not
// synced is gone), the journal fails writes (busy, I/O, disk full). After
// every event it checks what users rely on (see invariant in sim.cpp) and,
// once faults stop, that every run ends. Of workspaces: every committed
// step's files are what the journal's checkpoints fold to; an attempt after
// a crash begins on the last committed step's files; a power cut leaves no
// checkpoint without its pieces; a fork's journal and files are its
// origin's up to its step, none of which it executes again, and a fork
// past the end or into an existing run is refused and writes nothing.
#pragma once

#include <cstdint>
#include <string>

namespace cairn::sim {

struct options {
  std::uint64_t seed = 1;
  // "memory": the in-memory journal, with power cuts and failing writes.
  // "sqlite": a SQLite journal in a fresh folder (in /dev/shm, else $TMPDIR), the real
  // storage code and its fence; no power cuts or injected faults there
  // (tests/engine's power_loss_test cuts SQLite's power).
  std::string backend = "memory";
  // Events with faults before the quiet phase in which every run must end.
  int fault_events = 400;
  // Test-only unsafe switch of the in-memory journal: no commit syncs (a
  // power cut forgets what was acknowledged).
  bool no_sync = false;
  // "model": sim.cpp's model of the attempt driver, one effect per event.
  // "real": the engine's attempt driver (engine::run_attempt over the real
  // run_journal port), one event loop per attempt, on one thread, its
  // blocking work inline, its clock the simulation's; its agents are
  // sim_agent.hpp's, speaking the real protocol.
  std::string driver = "model";
  bool verbose = false;  // every event on stderr
};

struct outcome {
  bool ok = true;
  std::string failure;  // the invariant that broke, and where
  std::uint64_t trace_hash = 0;  // of every event, in order: a replay of the seed gives the same
  std::uint64_t events = 0;
  int runs = 0;  // simulated runs that reached their end
};

outcome simulate(const options& o);

}  // namespace cairn::sim
