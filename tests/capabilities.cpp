#include "tests/capabilities.hpp"

#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

// The listener base classes come with the external interfaces.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

namespace cairn::testing {
namespace {

std::mutex untested_mutex;
std::map<std::string, std::set<std::string>> untested;  // capability -> test cases

bool waived(const std::string& capability) {
  const char* list = std::getenv("CAIRN_TEST_WITHOUT");
  std::stringstream names(list ? list : "");
  for (std::string name; std::getline(names, name, ',');)
    if (name == capability) return true;
  return false;
}

// Prints, after the last case, what this binary did not test.
struct untested_summary : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats&) override {
    std::lock_guard lock(untested_mutex);
    for (const auto& [capability, cases] : untested) {
      std::cerr << "NOT TESTED without " << capability << " (CAIRN_TEST_WITHOUT): " << cases.size() << " case(s):";
      for (const auto& name : cases) std::cerr << "\n  - " << name;
      std::cerr << '\n';
    }
  }
};
CATCH_REGISTER_LISTENER(untested_summary)

}  // namespace

bool require_capability(const std::string& capability, bool present, const std::string& why) {
  if (present) return true;
  if (!waived(capability))
    FAIL("this case needs " << capability << " (" << why << "), which this machine does not give; run where it is "
                            << "present, or set CAIRN_TEST_WITHOUT=" << capability << " to leave the case untested");
  WARN("NOT TESTED: needs " << capability << " (" << why << "); absent and listed in CAIRN_TEST_WITHOUT");
  std::lock_guard lock(untested_mutex);
  untested[capability].insert(Catch::getResultCapture().getCurrentTestName());
  return false;
}

}  // namespace cairn::testing
