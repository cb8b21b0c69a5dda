// Starts `width` children of itself (default 2), each doing the same, and
// joins them: unbounded, the tree grows as width^depth. Refusals and failed
// children are caught, so every run of the tree completes.
#include <vector>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const int width = input.value("width", 2);
    std::vector<cairn::child_handle> children;
    cairn::json refused = cairn::json::array();
    for (int i = 0; i < width; ++i) {
      try {
        children.push_back(ctx.start_child("attempts_fanout_agent", input));
      } catch (const cairn::child_error& e) {
        refused.push_back(e.type());
      }
    }
    for (const auto& child : children) {
      try {
        ctx.join(child);
      } catch (const cairn::child_failed&) {
      }
    }
    return {{"children", children.size()}, {"refused", refused}};
  });
}
