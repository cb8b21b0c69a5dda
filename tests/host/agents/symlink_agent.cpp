// Attacks on the host paths of runs, from inside a sandbox (input "mode"):
//   "plant": makes /workspace/ID.1 and /workspace/ID.1.img (the names of its
//            first child's workspace and image under the old layout) links to
//            input "target", then starts itself as that child ("read") and
//            returns the child's output.
//   "read":  returns what its workspace holds as "secret.txt" ("absent" if
//            nothing), after trying to overwrite it.
//   "setuid": leaves a set-uid, set-gid executable "suid" in its workspace
//             and tries to make its log (stdout) set-uid too.
//   "open":  leaves its workspace open to every user: a 0666 file
//            "open.txt", a 1777 folder "drop" and the workspace itself 0777;
//            returns the modes they then have.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <cairn/cairn.hpp>

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const std::string mode = input.value("mode", "read");
    if (mode == "plant") {
      const std::string target = input.value("target", "/");
      ctx.step("plant", [&] {
        ::symlink(target.c_str(), (ctx.run_id() + ".1").c_str());
        ::symlink((target + "/secret.txt").c_str(), (ctx.run_id() + ".1.img").c_str());
        return json(true);
      });
      auto child = ctx.start_child("symlink_agent", {{"mode", "read"}});
      return ctx.join(child);
    }
    if (mode == "setuid") {
      return ctx.step("setuid", [&] {
        {
          std::ofstream out("suid");
          out << "#!/bin/sh\nid\n";
        }
        ::chmod("suid", 06755);
        ::fchmod(1, 04755);
        struct stat st {};
        ::stat("suid", &st);
        return json(st.st_mode & 07777);
      });
    }
    if (mode == "open") {
      return ctx.step("open", [&] {
        std::ofstream("open.txt") << "anyone may write this\n";
        ::chmod("open.txt", 0666);
        ::mkdir("drop", 0700);
        ::chmod("drop", 01777);
        ::chmod(".", 0777);
        json modes;
        for (const char* name : {"open.txt", "drop", "."}) {
          struct stat st {};
          ::stat(name, &st);
          modes[name] = st.st_mode & 07777;
        }
        return modes;
      });
    }
    return ctx.step("read", [&] {
      std::ifstream in("secret.txt");
      if (!in) return json("absent");
      std::stringstream s;
      s << in.rdbuf();
      std::ofstream("secret.txt", std::ios::trunc) << "overwritten by the child";
      return json(s.str());
    });
  });
}
