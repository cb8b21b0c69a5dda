// What a test case needs from the machine (root, cgroups, the workspace
// quota's loop devices) and did not get, made visible: such a case fails,
// unless the environment says the capability is absent on purpose.
//
//   CAIRN_TEST_WITHOUT=root,cgroups,quota   (comma-separated names)
//
// A listed capability that is missing turns the case into a warning naming
// what was not tested, and each test binary ends with a summary line listing
// every case left untested and why.
#pragma once

#include <string>

namespace cairn::testing {

// Returns `present`. When it is false: FAILs the running test case unless
// CAIRN_TEST_WITHOUT names `capability`; otherwise WARNs and records the case
// for the end-of-run summary, and the caller returns without testing.
// `why` says what the capability is for ("only root can plant a setuid file").
bool require_capability(const std::string& capability, bool present, const std::string& why);

}  // namespace cairn::testing
