// Text quoted in messages and tables: cut to size without breaking UTF-8,
// and valid UTF-8 whatever went in, so a quoted name or stderr can be
// journaled, framed and printed as it reads.
#include "protocol/text.hpp"

#include <catch2/catch.hpp>

#include <string>

namespace p = cairn::protocol;

TEST_CASE("clip keeps text that fits and cuts the rest between UTF-8 sequences") {
  CHECK(p::clip("short", 10) == "short");
  CHECK(p::clip("exactly ten", 11) == "exactly ten");
  CHECK(p::clip("a bit too long", 10) == "a bit t...");
  // "€" is 3 bytes: a cut at 7 bytes would fall inside the third one.
  const std::string euros = "€€€€€€";
  CHECK(p::clip(euros, 10) == "€€...");
  for (std::size_t max = 3; max <= euros.size(); ++max) {
    INFO(max);
    const auto clipped = p::clip(euros, max);
    CHECK(clipped.size() <= max);
    CHECK(p::is_utf8(clipped));
  }
}

TEST_CASE("clip_tail keeps the end, cut between UTF-8 sequences") {
  CHECK(p::clip_tail("fits", 4) == "fits");
  CHECK(p::clip_tail("line 1\nline 2\nerror: disk full", 19) == "...error: disk full");
  const std::string text = "ééé: the mail server refused 📨";
  for (std::size_t max = 3; max <= text.size(); ++max) {
    INFO(max);
    const auto clipped = p::clip_tail(text, max);
    CHECK(clipped.size() <= max);
    CHECK(p::is_utf8(clipped));
    CHECK(text.ends_with(clipped.substr(3)));
  }
}

TEST_CASE("clipped text is valid UTF-8 even when the input is not") {
  const std::string broken = "ok \xff\xfe then \xe2\x82 cut";
  CHECK(p::clip(broken, 100) == "ok \xEF\xBF\xBD\xEF\xBF\xBD then \xEF\xBF\xBD\xEF\xBF\xBD cut");
  CHECK(p::is_utf8(p::clip(broken, 8)));
  CHECK(p::is_utf8(p::clip_tail(broken, 100)));
  CHECK(p::clip_tail("\xff\xff\xff\xff", 6) == "...\xEF\xBF\xBD");
}

TEST_CASE("is_utf8 refuses what strict JSON serialization refuses") {
  CHECK(p::is_utf8(""));
  CHECK(p::is_utf8("plain, é, €, 📨"));
  CHECK_FALSE(p::is_utf8("\xc0\xaf"));          // overlong '/'
  CHECK_FALSE(p::is_utf8("\xed\xa0\x80"));      // a surrogate
  CHECK_FALSE(p::is_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  CHECK_FALSE(p::is_utf8("\xe2\x82"));          // cut short
  CHECK_FALSE(p::is_utf8("\xff"));
}
