// examples/line_editor.hpp's editing, keys fed through a pipe (no terminal: the same code without raw mode;
// tests/examples/kiln_chat_tty.cmake drives kiln-chat on a real terminal under tmux). The expected lines are
// what each key sequence does by the keys' definitions (readline's bindings for the same keys).
#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "../../examples/line_editor.hpp"
#include "test_util.hpp"

namespace {

using Editor = kiln_cli::LineEditor;

// Reads lines from `keys` with one editor until the end of input; each result as "status:text". Lines read
// go to the history; `history` receives it at the end.
std::vector<std::string> edit_lines(const std::string& keys, std::vector<std::string>* history = nullptr) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  REQUIRE(keys.size() < 60000);  // fits the pipe's buffer: written whole before reading
  REQUIRE(::write(fds[1], keys.data(), keys.size()) == ssize_t(keys.size()));
  ::close(fds[1]);
  const int null = ::open("/dev/null", O_WRONLY);
  REQUIRE(null >= 0);
  Editor e(fds[0], null);
  std::vector<std::string> out;
  for (;;) {
    Editor::Result r = e.read("> ");
    const char* s = r.status == Editor::Status::line ? "line" : r.status == Editor::Status::eof ? "eof" : "int";
    out.push_back(std::string(s) + ":" + r.text);
    if (r.status == Editor::Status::eof) break;
    if (r.status == Editor::Status::line) e.add_history(r.text);
  }
  ::close(fds[0]);
  ::close(null);
  if (history) *history = e.history();
  return out;
}

std::string one(const std::string& keys) { return edit_lines(keys).at(0); }

const std::string kLeft = "\x1b[D", kRight = "\x1b[C", kUp = "\x1b[A", kDown = "\x1b[B", kHome = "\x1b[H",
                  kEnd = "\x1b[F", kDel = "\x1b[3~";

}  // namespace

TEST_CASE("line editor: cursor moves, insertion and deletion") {
  CHECK(one("Once upon a tme" + kLeft + kLeft + "i\r") == "line:Once upon a time");
  CHECK(one("bc" + kHome + "a" + kEnd + "d\r") == "line:abcd");
  CHECK(one("bc\x01"
            "a\x05"
            "d\r") == "line:abcd");                 // Ctrl-A, Ctrl-E
  CHECK(one("abc\x02\x02\x06X\r") == "line:abXc");  // Ctrl-B, Ctrl-F
  CHECK(one("abc\x7f\r") == "line:ab");
  CHECK(one("abc\x08\r") == "line:ab");
  CHECK(one("abc" + kHome + kDel + "\r") == "line:bc");
  CHECK(one("abc" + kHome + "\x04\r") == "line:bc");                         // Ctrl-D on a non-empty line deletes
  CHECK(one("hello world" + kLeft + kLeft + "\x15\r") == "line:ld");         // Ctrl-U
  CHECK(one("hello world" + kLeft + kLeft + "\x0b\r") == "line:hello wor");  // Ctrl-K
  CHECK(one("hello big  world\x17\r") == "line:hello big  ");                // Ctrl-W
  CHECK(one("hello big  \x17\r") == "line:hello ");
  CHECK(one("\x1bOH"
            "b\x1bOF"
            "c" +
            std::string("\x1b[1~") + "a\r") == "line:abc");                                   // SS3 and "1~" home
  CHECK(one("ab" + kLeft + kLeft + kLeft + kRight + kRight + kRight + "c\r") == "line:abc");  // ends clamp
  CHECK(one("x\x1b[1;5D"
            "y\r") == "line:yx");  // a modified arrow moves as the plain one
  CHECK(one("a\x1b[15~"
            "b\x1b"
            "xc\r") == "line:abc");       // an unknown CSI and an Alt-key are dropped
  CHECK(one("a\tb\x0c\r") == "line:ab");  // tab ignored, Ctrl-L only redraws
}

TEST_CASE("line editor: UTF-8 moves by code point") {
  // é (2 bytes), 日 (3 bytes), 😀 (4 bytes)
  const std::string e = "\xc3\xa9", ri = "\xe6\x97\xa5", smile = "\xf0\x9f\x98\x80";
  CHECK(one(e + ri + smile + kLeft + kLeft + "x\r") == "line:" + e + "x" + ri + smile);
  CHECK(one(e + ri + smile + "\x7f\x7f\r") == "line:" + e);
  CHECK(one(e + ri + smile + kHome + kDel + kDel + "\r") == "line:" + smile);
  CHECK(one(e + ri + kLeft + "\x0b\r") == "line:" + e);
  CHECK(one("a\xe6\x97"
            "b\r") == "line:a");  // a broken sequence is dropped (with the byte that broke it)
}

TEST_CASE("line editor: Enter, Ctrl-C, Ctrl-D and the end of input") {
  CHECK(edit_lines("a\nb\r") == std::vector<std::string>{"line:a", "line:b", "eof:"});
  CHECK(edit_lines("half\x03\x03\x04") == std::vector<std::string>{"int:half", "int:", "eof:"});
  CHECK(edit_lines("typed") == std::vector<std::string>{"eof:typed"});
}

TEST_CASE("line editor: history") {
  // Up recalls the previous lines, newest first; down returns to the line being typed.
  CHECK(edit_lines("first\rsecond\r" + kUp + kUp + "\r") ==
        std::vector<std::string>{"line:first", "line:second", "line:first", "eof:"});
  CHECK(edit_lines("first\rsecond\r" + kUp + kUp + kUp + kDown + "\r") ==
        std::vector<std::string>{"line:first", "line:second", "line:second", "eof:"});
  CHECK(edit_lines("one\rnew" + kUp + kDown + "\r") == std::vector<std::string>{"line:one", "line:new", "eof:"});
  // Editing a recalled line leaves the history as it was; Ctrl-P/N are up/down.
  std::vector<std::string> h;
  CHECK(edit_lines("abc\r" + kUp + "d\r\x10\x10\r", &h) ==
        std::vector<std::string>{"line:abc", "line:abcd", "line:abc", "eof:"});
  CHECK(h == std::vector<std::string>{"abc", "abcd", "abc"});
  // Empty lines and repeats of the last line are not added.
  CHECK(edit_lines("x\rx\r\ry\r", &h) == std::vector<std::string>{"line:x", "line:x", "line:", "line:y", "eof:"});
  CHECK(h == std::vector<std::string>{"x", "y"});
}
