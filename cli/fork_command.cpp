// `cairn fork RUN --at SEQ`: a new run from RUN's journal up to step SEQ,
// executed here like `cairn run`'s, or left pending (--detach) like
// `cairn submit`'s.
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/support.hpp"
#include "protocol/bounded_json.hpp"

namespace cairn::cli {

int fork_command(const paths& p, const fork_args& args, bool as_json) {
  return guarded([&] {
    engine::fork_request request;
    request.from = args.run_id;
    request.seq = args.seq;
    request.id = args.id;
    request.agent = args.agent;
    request.hold = !args.detach;
    if (args.input) try {
        request.input =
            protocol::parse_bounded(*args.input, "--input", {protocol::max_input_depth, protocol::default_max_frame});
      } catch (const protocol::json_error& e) {
        std::cerr << "cairn: " << e.what() << "\n";
        return 2;
      }
    if (!args.detach) stop_follow_on_signals();
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    const auto [run, restored] = eng.fork(request);
    const std::string note =
        restored ? fmt::format("its workspace is run {}'s at step {}", args.run_id, args.seq)
                 : fmt::format("run {} kept no workspace checkpoints up to step {}: the fork starts with an empty "
                               "workspace",
                               args.run_id, args.seq);
    if (args.detach) {
      if (as_json) {
        auto out = to_json(run);
        out["forked_from"] = {{"run", args.run_id}, {"seq", args.seq}};
        out["workspace_restored"] = restored;
        std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
      } else {
        std::cout << run.id << std::endl;
        std::cerr << fmt::format("forked from {} at step {}; {}", args.run_id, args.seq, note) << std::endl;
      }
      if (auto hint = no_daemon_hint(*journal, p, run.id); !hint.empty()) std::cerr << hint << std::endl;
      return 0;
    }
    if (!as_json)
      std::cout << fmt::format("run {} forked from {} at step {}; {}", run.id, args.run_id, args.seq, note)
                << std::endl;
    print_history(*journal, run.id, as_json);
    auto end = follow(p, run.id, as_json);
    if (const int signal = stop_signal()) return report_stopped(end, signal, as_json);
    return report_end(p, end, as_json);
  });
}

}  // namespace cairn::cli
