// The start time of a process in clock ticks, field 22 of /proc/PID/stat,
// read independently of engine/owner.cpp so the tests check it.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <sys/types.h>

inline unsigned long long proc_start_ticks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;
  return std::stoull(field);
}
