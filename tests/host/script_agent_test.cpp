// A script agent (a program that starts with #!) runs from a read-only bind
// of its own folder: it reads its own files, and can neither change that
// folder nor reach past it, through a path or a link it finds there.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "tests/cairn_cli.hpp"
#include "tests/host/engine_host.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cairn::testing::slurp;

TEST_CASE("a script agent reads its own folder read-only and reaches nothing beside it") {
  cairn::testing::engine_host h(60s);
  ::chmod(h.dir.path().c_str(), 0755);  // the sandbox uid passes through to the agent's folder
  const fs::path app = h.dir / "app", beside = h.dir / "beside.txt";
  fs::create_directories(app);
  std::ofstream(app / "data.txt") << "the agent's own data\n";
  std::ofstream(beside) << "not the agent's\n";
  ::chmod(beside.c_str(), 0644);
  fs::create_symlink(beside, app / "link");  // an absolute host path, followed inside the sandbox
  std::ofstream(app / "agent.sh") << R"(#!/bin/sh
cd /workspace
cat /run/cairn/app/data.txt > own 2>&1
cat /run/cairn/app/link > through_link 2>&1 || echo refused >> through_link
cat /run/cairn/beside.txt > beside 2>&1 || echo refused >> beside
touch /run/cairn/app/planted 2> planted || echo refused >> planted
echo changed >> /run/cairn/app/data.txt 2> append || echo refused >> append
)";
  ::chmod((app / "agent.sh").c_str(), 0755);
  const std::string before = slurp(app / "data.txt");

  h.submit("script", (app / "agent.sh").string(), nullptr, nlohmann::json::object(), 1);
  auto run = h.eng->execute("script");
  CHECK(run.status == cairn::storage::run_status::failed);  // it never spoke the protocol
  const fs::path ws = h.dir / "ws" / "script";
  CHECK(slurp(ws / "own") == "the agent's own data\n");
  for (const char* attempt : {"through_link", "beside", "planted", "append"}) {
    INFO(attempt << ": " << slurp(ws / attempt));
    CHECK_THAT(slurp(ws / attempt), Catch::EndsWith("refused\n"));
    CHECK_THAT(slurp(ws / attempt), !Catch::Contains("not the agent's"));
  }
  CHECK_FALSE(fs::exists(app / "planted"));
  CHECK(slurp(app / "data.txt") == before);
}
