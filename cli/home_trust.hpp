// cairn trusts only what its user owns. CAIRN_HOME, the journal (and its
// SQLite side files, its daemon lock, its folder) and the folders of runs
// must belong to the user running cairn and be writable by nobody else:
// else another local user could queue runs that this user (root, under
// `cairn serve`) would execute, or plant links for cairn to follow.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cli/paths.hpp"

namespace cairn::cli {

class trust_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Creates CAIRN_HOME when missing (0700; 0711 under root, whose sandbox uid
// must pass through to the workspaces), then checks every path above that
// exists. Throws trust_error naming the path, its owner and the fix. Returns
// warnings: config.json readable by group or others.
std::vector<std::string> secure_home(const paths& p);

}  // namespace cairn::cli
