// The conformance agents this build has, one per SDK (see SCENARIOS.md).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace cairn::testing {

struct sdk_agent {
  std::string language;
  std::filesystem::path program;
};

inline std::vector<sdk_agent> conformance_agents() {
  std::vector<sdk_agent> agents{{"C++", CPP_CONFORMANCE_AGENT}};
#ifdef PYTHON_CONFORMANCE_AGENT
  agents.push_back({"Python", PYTHON_CONFORMANCE_AGENT});
#endif
#ifdef JS_CONFORMANCE_AGENT
  agents.push_back({"JavaScript", JS_CONFORMANCE_AGENT});
#endif
  return agents;
}

}  // namespace cairn::testing
