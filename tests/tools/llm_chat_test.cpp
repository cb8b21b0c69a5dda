// llm.chat against cairn-mock-llm: replies assembled from JSON and from SSE,
// the grant's limits, the host's key kept out of everything the agent sees.
#include "engine/tools/llm_chat.hpp"

#include <cstdlib>

#include <catch2/catch.hpp>

#include "tests/tools/mock_server.hpp"

namespace cairn::engine::test {
namespace {

const json hello = {{"messages", {{{"role", "user"}, {"content", "hello there world"}}}}};

llm_endpoint endpoint_of(const mock_server& server, std::string key = "") {
  return {server.url("/v1"), std::move(key), "mock-model"};
}

llm_chat_grant grant(bool stream) {
  llm_chat_grant g;
  g.stream = stream;
  return g;
}

// Sets an environment variable for one scope; restores the old value after.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~scoped_env() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("a non-streamed reply is returned as content, role, model, finish_reason and usage") {
  mock_server server;
  auto chat = make_llm_chat(grant(false), endpoint_of(server));
  auto call = make_call(hello);
  int events = 0;
  call.emit = [&](const json&) { ++events; };
  auto result = chat->call(call);
  CHECK(result["content"] == "Summary: hello there world");
  CHECK(result["role"] == "assistant");
  CHECK(result["model"] == "mock-model");
  CHECK(result["finish_reason"] == "stop");
  CHECK(result["usage"]["completion_tokens"] == 4);
  CHECK(events == 0);
  auto sent = server.requests().at(0)["body"];
  CHECK_FALSE(sent.contains("stream"));
  CHECK(sent["max_tokens"] == 4096);  // the grant's cap is the default
}

TEST_CASE("a streamed reply emits its tokens live, in order, and returns them assembled") {
  mock_server server;
  auto chat = make_llm_chat(grant(true), endpoint_of(server));
  auto call = make_call(hello, 12);
  std::vector<json> events;
  call.emit = [&](const json& event) { events.push_back(event); };
  auto result = chat->call(call);
  CHECK(result["content"] == "Summary: hello there world");
  CHECK(result["finish_reason"] == "stop");
  CHECK(result["model"] == "mock-model");
  CHECK(result["usage"]["total_tokens"] == 7);
  REQUIRE(events.size() == 4);
  std::string joined;
  for (const auto& event : events) {
    CHECK(event["type"] == "token");
    CHECK(event["tool"] == "llm.chat");
    CHECK(event["seq"] == 12);
    joined += event["text"].get<std::string>();
  }
  CHECK(events[0]["text"] == "Summary: ");
  CHECK(joined == result["content"]);
  auto sent = server.requests().at(0)["body"];
  CHECK(sent["stream"] == true);
  CHECK(sent["stream_options"]["include_usage"] == true);
}

TEST_CASE("the OpenAI fields llm.chat knows pass through; stream is the host's choice") {
  testing::temp_dir dir;
  std::ofstream(dir / "script.json") << R"({"replies": [{"match": "weather", "content": "Sunny all day."}]})";
  mock_server server({"--script", (dir / "script.json").string()});
  json args = {{"messages",
                {{{"role", "system"}, {"content", "be brief"}},
                 {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}},
                 {{"role", "user"}, {"content", "what is the weather?"}}}},
               {"temperature", 0.2},
               {"stream", false}};
  auto result = make_llm_chat(grant(true), endpoint_of(server))->call(make_call(args));
  CHECK(result["content"] == "Sunny all day.");
  auto sent = server.requests().at(0)["body"];
  CHECK(sent["temperature"] == 0.2);
  CHECK(sent["stream"] == true);
  CHECK(sent["messages"][1]["tool_calls"] == json::array());
}

TEST_CASE("fields llm.chat does not know never reach the server") {
  mock_server server;
  json args = {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hello there"}}}},
                              {"audio", {{"url", "http://169.254.169.254/latest"}}}}}},
               {"logit_bias", {{"50256", -100}}},
               {"image_url", "http://10.0.0.1/internal.png"},
               {"seed", 4}};
  make_llm_chat(grant(false), endpoint_of(server))->call(make_call(args));
  auto sent = server.requests().at(0)["body"];
  CHECK(sent["messages"] == json{{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hello there"}}}}}});
  CHECK(sent["seed"] == 4);
  for (const char* dropped : {"logit_bias", "image_url"}) CHECK_FALSE(sent.contains(dropped));
  CHECK(server.requests().at(0).dump().find("169.254") == std::string::npos);
}

TEST_CASE("an image part is refused unless the grant allows images") {
  mock_server server;
  json image = {{"type", "image_url"}, {"image_url", {{"url", "http://10.0.0.1/secret.png"}, {"x", 1}}}};
  json args = {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "what is this"}}, image}}}}}};
  auto error = error_of([&] { make_llm_chat(grant(false), endpoint_of(server))->call(make_call(args)); });
  CHECK(error.type() == "refused");
  CHECK_THAT(error.what(), Catch::Contains("\"images\": true"));
  CHECK(server.requests().empty());

  auto g = grant(false);
  g.images = true;
  make_llm_chat(g, endpoint_of(server))->call(make_call(args));
  CHECK(server.requests().at(0)["body"]["messages"][0]["content"][1] ==
        json{{"type", "image_url"}, {"image_url", {{"url", "http://10.0.0.1/secret.png"}}}});
}

TEST_CASE("the token budget lowers max_tokens to what is left, then refuses; a resumed run counts what it spent") {
  mock_server server;
  auto g = grant(false);
  g.max_total_tokens = 10;
  auto chat = make_llm_chat(g, endpoint_of(server));
  auto first = chat->call(make_call(hello));  // 3 prompt + 4 completion tokens
  CHECK(tokens_counted(first) == 7);
  auto second = chat->call(make_call(hello));
  CHECK(server.requests().at(1)["body"]["max_tokens"] == 3);
  CHECK(second["finish_reason"] == "length");
  auto error = error_of([&] { chat->call(make_call(hello)); });
  CHECK(error.type() == "refused");
  CHECK_THAT(error.what(), Catch::Contains("13 tokens") && Catch::Contains("max_total_tokens is 10"));
  CHECK(server.requests().size() == 2);

  auto resumed = make_llm_chat(g, endpoint_of(server), tokens_counted(first) + tokens_counted(second));
  CHECK(error_of([&] { resumed->call(make_call(hello)); }).type() == "refused");
  CHECK(server.requests().size() == 2);
}

TEST_CASE("a reply nested 300,000 levels deep fails that call alone, streamed or not") {
  mock_server server;
  for (bool stream : {false, true}) {
    INFO("stream " << stream);
    auto error = error_of([&] {
      make_llm_chat(grant(stream), llm_endpoint{server.url("/deep"), "", "mock-model"})->call(make_call(hello));
    });
    CHECK(error.type() == "bad_output");
    CHECK_THAT(error.what(), Catch::Contains("deeper than 64 levels"));
  }
  CHECK(make_llm_chat(grant(true), endpoint_of(server))->call(make_call(hello))["content"] ==
        "Summary: hello there world");
}

TEST_CASE("models outside the grant are refused; a call must end up with some model") {
  mock_server server;
  auto g = grant(false);
  g.models = {"mock-model"};
  auto chat = make_llm_chat(g, endpoint_of(server));
  CHECK(chat->call(make_call(hello))["model"] == "mock-model");  // the host's default model
  json other = hello;
  other["model"] = "gpt-huge";
  auto error = error_of([&] { chat->call(make_call(other)); });
  CHECK(error.type() == "refused");
  CHECK_THAT(error.what(), Catch::Contains("gpt-huge") && Catch::Contains("mock-model"));

  auto no_default = endpoint_of(server);
  no_default.model = "";
  auto none = error_of([&] { make_llm_chat(grant(false), no_default)->call(make_call(hello)); });
  CHECK(none.type() == "refused");
  CHECK_THAT(none.what(), Catch::Contains("CAIRN_LLM_MODEL"));
  CHECK(server.requests().size() == 1);
}

TEST_CASE("max_tokens above the grant's cap is refused; within it, it reaches the server") {
  mock_server server;
  auto g = grant(false);
  g.max_tokens = 100;
  auto chat = make_llm_chat(g, endpoint_of(server));
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    json args = hello;
    args[field] = 101;
    auto error = error_of([&] { chat->call(make_call(args)); });
    CHECK(error.type() == "refused");
    CHECK_THAT(error.what(), Catch::Contains("100"));
  }
  CHECK(server.requests().empty());
  json args = hello;
  args["max_tokens"] = 2;
  auto result = chat->call(make_call(args));
  CHECK(result["content"] == "Summary: hello ");
  CHECK(result["finish_reason"] == "length");
}

TEST_CASE("messages must be an array of objects with a role") {
  mock_server server;
  auto chat = make_llm_chat(grant(false), endpoint_of(server));
  for (json args : {json{{"messages", "hi"}}, json{{"messages", json::array()}}, json::object(),
                    json{{"messages", {{{"content", "no role"}}}}}, json{{"messages", {"hi"}}},
                    json{{"messages", {{{"role", "user"}, {"content", 5}}}}}}) {
    INFO(args.dump());
    CHECK(error_of([&] { chat->call(make_call(args)); }).type() == "refused");
  }
  CHECK(server.requests().empty());
}

TEST_CASE("the host's API key authorizes the call and never reaches the agent") {
  const std::string key = "sk-test-4f9a1c2b7d";
  mock_server server({"--require-key", key});
  CHECK(make_llm_chat(grant(true), endpoint_of(server, key))->call(make_call(hello))["content"] ==
        "Summary: hello there world");

  auto wrong_key = make_llm_chat(grant(false), endpoint_of(server, "sk-wrong-1"));
  auto wrong = error_of([&] { wrong_key->call(make_call(hello)); });
  CHECK(wrong.type() == "failed");
  CHECK_THAT(wrong.what(), Catch::Contains("401") && Catch::Contains("Incorrect API key"));
  CHECK_THAT(wrong.what(), !Catch::Contains("sk-wrong-1"));

  // An endpoint that echoes the request back (and so the key) is bad output, with the key blanked.
  auto echo = endpoint_of(server, key);
  echo.base_url = server.url("/echo");
  auto echoed = error_of([&] { make_llm_chat(grant(false), echo)->call(make_call(hello)); });
  CHECK(echoed.type() == "bad_output");
  CHECK_THAT(echoed.what(), Catch::Contains("[redacted]") && !Catch::Contains(key));

  auto requests = server.requests();
  CHECK(requests.at(0)["authorization"] == "matched");
  CHECK(requests.at(1)["authorization"] == "wrong");
  CHECK(slurp(server.log_path()).find(key) == std::string::npos);
}

TEST_CASE("without an endpoint every call is unavailable and says what to set") {
  auto error = error_of([&] { make_llm_chat(grant(true), std::nullopt)->call(make_call(hello)); });
  CHECK(error.type() == "unavailable");
  CHECK_THAT(error.what(), Catch::Contains("CAIRN_LLM_BASE_URL") && Catch::Contains("CAIRN_LLM_API_KEY"));
}

TEST_CASE("answers that are not chat completions are bad_output; overload is unavailable") {
  mock_server server;
  auto at = [&](const std::string& path) { return llm_endpoint{server.url(path), "", "mock-model"}; };
  for (bool stream : {false, true}) {
    INFO("stream " << stream);
    auto garbage = error_of([&] { make_llm_chat(grant(stream), at("/big"))->call(make_call(hello)); });
    CHECK(garbage.type() == "bad_output");
    CHECK_THAT(garbage.what(), Catch::Contains("xxxx"));
    auto busy = error_of([&] { make_llm_chat(grant(stream), at("/status/503"))->call(make_call(hello)); });
    CHECK(busy.type() == "unavailable");
    CHECK_THAT(busy.what(), Catch::Contains("503") && Catch::Contains("mock status 503"));
    auto missing = error_of([&] { make_llm_chat(grant(stream), at("/pages"))->call(make_call(hello)); });
    CHECK(missing.type() == "failed");
    CHECK_THAT(missing.what(), Catch::Contains("404"));
  }
}

TEST_CASE("an endpoint slower than the grant's timeout gives timeout, on time") {
  mock_server server;
  auto g = grant(true);
  g.timeout = 300ms;
  auto start = std::chrono::steady_clock::now();
  auto error = error_of([&] { make_llm_chat(g, llm_endpoint{server.url("/slow"), "", "m"})->call(make_call(hello)); });
  CHECK(error.type() == "timeout");
  CHECK(std::chrono::steady_clock::now() - start < 4500ms);  // the server answers after 5 s
}

TEST_CASE("llm_endpoint_from_host: the config file, overridden by the environment") {
  testing::temp_dir dir;
  auto config = (dir / "config.json").string();
  scoped_env base("CAIRN_LLM_BASE_URL", nullptr), key("CAIRN_LLM_API_KEY", nullptr),
      model("CAIRN_LLM_MODEL", nullptr);

  CHECK_FALSE(llm_endpoint_from_host(config).has_value());  // no file, no variables

  std::ofstream(config) << R"({"llm": {"base_url": "http://127.0.0.1:8080/v1/", "api_key": "k1", "model": "m1"}})";
  auto from_file = llm_endpoint_from_host(config);
  REQUIRE(from_file);
  CHECK(from_file->base_url == "http://127.0.0.1:8080/v1");
  CHECK(from_file->api_key == "k1");
  CHECK(from_file->model == "m1");

  scoped_env base2("CAIRN_LLM_BASE_URL", "https://api.example.com/v1"), key2("CAIRN_LLM_API_KEY", "k2");
  auto overridden = llm_endpoint_from_host(config);
  REQUIRE(overridden);
  CHECK(overridden->base_url == "https://api.example.com/v1");
  CHECK(overridden->api_key == "k2");
  CHECK(overridden->model == "m1");
}

TEST_CASE("llm_endpoint_from_host: a broken config file or base URL is a clear error") {
  testing::temp_dir dir;
  auto config = (dir / "config.json").string();
  scoped_env base("CAIRN_LLM_BASE_URL", nullptr), key("CAIRN_LLM_API_KEY", nullptr),
      model("CAIRN_LLM_MODEL", nullptr);
  std::ofstream(config) << "{\"llm\": {\"base_url\": ";
  CHECK_THROWS_WITH(llm_endpoint_from_host(config), Catch::Contains(config) && Catch::Contains("not valid JSON"));
  std::ofstream(config) << R"({"llm": "http://127.0.0.1/v1"})";
  CHECK_THROWS_WITH(llm_endpoint_from_host(config), Catch::Contains(config) && Catch::Contains("\"llm\""));
  std::ofstream(config) << R"({"llm": {"base_url": "ftp://127.0.0.1/v1"}})";
  CHECK_THROWS_WITH(llm_endpoint_from_host(config), Catch::Contains("ftp"));
}

}  // namespace cairn::engine::test
