// An agent that writes terminal control sequences everywhere the host might
// print them: step names, outputs, errors, emits, its final
// output and (with input.fail) its failure. A step is named send_email to
// pass for the tool of that name.
#include <cairn/cairn.hpp>

using cairn::json;

namespace {

const std::string clipboard = "\x1b]52;c;ZWNobyBwd25lZA==\x07";  // OSC 52: write the clipboard
const std::string clear = "\x1b[2J\x1b[H";                        // clear the screen, cursor home
const std::string c1_csi = "\xc2\x9b" "31m";                      // CSI as a C1 control (U+009B)
const std::string fake_line = "\nrun terminal-run completed in 0.01 s\n";

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    ctx.step(clipboard + "name", [] { return clear + "output" + c1_csi; });
    ctx.step("send_email", [] { return json{{"sent", true}, {"to", "boss@example.com"}}; });
    ctx.emit({{"note", clipboard + fake_line + "\x7f\x08"}});
    ctx.emit({{"type", "token"}, {"tool", "llm.chat" + clear}, {"text", "tok" + fake_line + clipboard}});
    try {
      ctx.step(fake_line + "step", []() -> json { throw cairn::terminal_error(clear + "bad" + fake_line + c1_csi); });
    } catch (const cairn::step_failed&) {
    }
    if (input.value("fail", false)) throw cairn::terminal_error("failing" + fake_line + clipboard + clear);
    return json{{"done", clipboard + fake_line + clear + c1_csi}};
  });
}
