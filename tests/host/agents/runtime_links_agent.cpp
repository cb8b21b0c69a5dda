// Attack on copy-out (issue 9.3): one 4 MiB file, 40 hard links to it and 40
// sparse files of 4 MiB in /workspace; a copy that breaks links and fills
// holes writes 325 MiB to the host for a 16 MiB quota.
#include <fcntl.h>
#include <unistd.h>

#include <string>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json&) -> cairn::json {
    return ctx.step("fill", [] {
      const std::string block(1 << 20, 'x');
      int fd = ::open("data", O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (int i = 0; i < 4; ++i)
        if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) return false;
      ::close(fd);
      for (int i = 0; i < 40; ++i) {
        if (::link("data", ("link" + std::to_string(i)).c_str()) < 0) return false;
        int sparse = ::open(("sparse" + std::to_string(i)).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (sparse < 0 || ::ftruncate(sparse, 4 << 20) < 0 || ::pwrite(sparse, "end", 3, (4 << 20) - 3) != 3)
          return false;
        ::close(sparse);
      }
      return true;
    });
  });
}
