// For `cairn workspace`: leaves in its workspace a file, a link out of it,
// a file whose name and bytes are terminal escape sequences, and a folder
// and a file in it that it made mode 0 (its own, so its user may read them
// all the same), then waits
// for the signal "go" (suspended meanwhile) and returns what notes/a.txt
// holds then.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <cairn/cairn.hpp>

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json&) -> json {
    ctx.step("write", [] {
      ::mkdir("notes", 0755);
      std::ofstream("notes/a.txt") << "hello from the agent\n";
      ::symlink("/etc/shadow", "escape");
      std::ofstream("\x1b]0;pwned\x07name.txt") << "\x1b[2J";
      ::mkdir("locked", 0755);
      std::ofstream("locked/kept.txt") << "kept\n";
      ::chmod("locked/kept.txt", 0);
      ::chmod("locked", 0);
      return json(true);
    });
    ctx.wait_signal("go");
    return ctx.step("read", [] {
      std::ifstream in("notes/a.txt");
      std::stringstream text;
      text << in.rdbuf();
      return json(text.str());
    });
  });
}
