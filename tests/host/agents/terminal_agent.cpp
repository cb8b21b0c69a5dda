// An agent that writes terminal control sequences, bidi controls and line
// separators everywhere the host might print them: step names, outputs,
// errors, emits, its final output and (with input.fail) its failure. A step is named send_email to
// pass for the tool of that name.
#include <cairn/cairn.hpp>

using cairn::json;

namespace {

const std::string clipboard = "\x1b]52;c;ZWNobyBwd25lZA==\x07";  // OSC 52: write the clipboard
const std::string clear = "\x1b[2J\x1b[H";                        // clear the screen, cursor home
const std::string c1_csi = "\xc2\x9b" "31m";                      // CSI as a C1 control (U+009B)
const std::string fake_line = "\nrun terminal-run completed in 0.01 s\n";
// Trojan Source: U+202E (right-to-left override) and U+2066 (left-to-right
// isolate) reorder what follows them; U+2028 (line separator) breaks a line.
const std::string bidi = "\xe2\x80\xae" "gnp.exe" "\xe2\x81\xa6" "ok" "\xe2\x80\xa8" "run terminal-run completed";

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    ctx.step(clipboard + "name" + bidi, [] { return clear + "output" + c1_csi + bidi; });
    ctx.step("send_email", [] { return json{{"sent", true}, {"to", "boss@example.com"}}; });
    ctx.emit({{"note", clipboard + fake_line + "\x7f\x08" + bidi}});
    ctx.emit({{"type", "token"}, {"tool", "llm.chat" + clear}, {"text", "tok" + fake_line + clipboard}});
    try {
      ctx.step(fake_line + "step", []() -> json { throw cairn::terminal_error(clear + "bad" + fake_line + c1_csi + bidi); });
    } catch (const cairn::step_failed&) {
    }
    if (input.value("fail", false)) throw cairn::terminal_error("failing" + fake_line + clipboard + clear + bidi);
    return json{{"done", clipboard + fake_line + clear + c1_csi + bidi}};
  });
}
