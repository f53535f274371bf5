// examples/line_editor.hpp - a small line editor for kiln-chat on a terminal: printable UTF-8 (the cursor
// moves by code point), left/right (Ctrl-B/F), home/end (Ctrl-A/E), backspace, delete, Ctrl-U/K/W,
// up/down history (Ctrl-P/N), Ctrl-L, Ctrl-Z; Ctrl-C and Ctrl-D are reported to the caller.
//
// Why not readline or libedit: readline is GPL, and kiln is a library users embed and copy examples from;
// libedit (BSD) is one more system dependency for a dozen keys, and its behaviour with UTF-8 and signals
// differs between versions and platforms. This editor redraws one line with three escape sequences every
// VT100-style terminal knows (CR, erase to end of line, cursor forward), scrolling horizontally when the
// line is wider than the terminal. Known limit: a double-width character (CJK, emoji) counts as one
// column, so the cursor is drawn off by one column per such character to its left.
//
// The terminal is in raw mode only inside read(); a scope guard restores it on every return and exception,
// and install_terminal_signal_handlers() restores it before SIGTERM/SIGHUP/SIGQUIT end the process
// (tcsetattr is async-signal-safe). While a reply runs the terminal is in its normal mode, so Ctrl-C
// raises SIGINT, whose handler only sets interrupt_flag() (checked between tokens).
#pragma once

#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kiln_cli {

namespace detail::term {
inline volatile std::sig_atomic_t interrupted = 0;
inline volatile std::sig_atomic_t raw_fd = -1;  // the descriptor in raw mode, -1 when none
inline termios saved{};                         // its settings before raw mode

inline void restore() noexcept {
  const int fd = raw_fd;
  if (fd >= 0) {
    ::tcsetattr(fd, TCSADRAIN, &saved);
    raw_fd = -1;
  }
}
inline void on_sigint(int) { interrupted = 1; }
inline void on_fatal(int sig) {  // restores the terminal, then the default action (SA_RESETHAND)
  restore();
  ::raise(sig);
}
}  // namespace detail::term

/// Set by SIGINT (after install_terminal_signal_handlers()); the caller clears it.
inline volatile std::sig_atomic_t& interrupt_flag() { return detail::term::interrupted; }

/// SIGINT sets interrupt_flag() instead of ending the process; SIGTERM, SIGHUP and SIGQUIT restore a
/// terminal left in raw mode first, then end the process as before.
inline void install_terminal_signal_handlers() {
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = detail::term::on_sigint;
  sa.sa_flags = 0;  // no SA_RESTART: a read() waiting for a key returns, and the editor sees the interrupt
  ::sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = detail::term::on_fatal;
  sa.sa_flags = SA_RESETHAND;
  for (int sig : {SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(sig, &sa, nullptr);
}

class LineEditor {
 public:
  enum class Status {
    line,       // Enter: text is the line
    eof,        // Ctrl-D on an empty line, or the end of input
    interrupt,  // Ctrl-C (or SIGINT): text is the line as it was, discarded
  };
  struct Result {
    Status status;
    std::string text;
  };

  /// Reads keys from in_fd and draws on out_fd; raw mode is set when in_fd is a terminal (a pipe gives the
  /// same editing without it: for tests).
  LineEditor(int in_fd, int out_fd) : in_(in_fd), out_(out_fd) {}

  /// One line after `prompt` (ASCII).
  Result read(std::string_view prompt) {
    RawMode raw(in_);
    detail::term::interrupted = 0;  // a Ctrl-C just after a reply ended was meant for the reply
    prompt_ = prompt;
    // History navigation edits copies: the entries themselves change only through add_history().
    work_ = history_;
    work_.emplace_back();
    idx_ = work_.size() - 1;
    buf_.clear();
    pos_ = 0;
    refresh();
    for (;;) {
      const int c = key();
      switch (c) {
        case kEof:
          return done(Status::eof, "");
        case '\r':
        case '\n':
          return done(Status::line, "");
        case 3:  // Ctrl-C
          return done(Status::interrupt, "^C");
        case 4:  // Ctrl-D: end of input on an empty line, else delete
          if (buf_.empty()) return done(Status::eof, "");
          erase_next();
          break;
        case 1:  // Ctrl-A
        case kHome:
          pos_ = 0;
          break;
        case 5:  // Ctrl-E
        case kEnd:
          pos_ = buf_.size();
          break;
        case 2:  // Ctrl-B
        case kLeft:
          pos_ = prev(pos_);
          break;
        case 6:  // Ctrl-F
        case kRight:
          pos_ = next(pos_);
          break;
        case 8:  // Ctrl-H
        case 127:
          if (pos_ > 0) {
            const std::size_t p = prev(pos_);
            buf_.erase(p, pos_ - p);
            pos_ = p;
          }
          break;
        case kDelete:
          erase_next();
          break;
        case 0x15:  // Ctrl-U: to the start
          buf_.erase(0, pos_);
          pos_ = 0;
          break;
        case 0x0b:  // Ctrl-K: to the end
          buf_.erase(pos_);
          break;
        case 0x17: {  // Ctrl-W: the word before the cursor (and the spaces after it)
          std::size_t p = pos_;
          while (p > 0 && buf_[p - 1] == ' ') --p;
          while (p > 0 && buf_[p - 1] != ' ') --p;
          buf_.erase(p, pos_ - p);
          pos_ = p;
          break;
        }
        case 0x10:  // Ctrl-P
        case kUp:
          recall(+1);
          break;
        case 0x0e:  // Ctrl-N
        case kDown:
          recall(-1);
          break;
        case 0x0c:  // Ctrl-L: clear the screen
          write_out("\x1b[H\x1b[2J");
          break;
        case 0x1a:  // Ctrl-Z: suspend with the terminal restored, redraw when continued
          raw.off();
          write_out("\r\n");
          ::raise(SIGTSTP);
          raw.on();
          break;
        default:
          if (c >= 0x20 && c < 0x7f) insert(std::string(1, char(c)));
          else if (c >= 0xc2 && c <= 0xf4) insert_utf8(c);
          break;  // other control keys and stray bytes: ignored
      }
      refresh();
    }
  }

  /// Adds a line to the history (not an empty one, nor a repeat of the last one); the oldest entries go
  /// past 1000.
  void add_history(std::string line) {
    if (line.empty() || (!history_.empty() && history_.back() == line)) return;
    history_.push_back(std::move(line));
    if (history_.size() > 1000) history_.erase(history_.begin());
  }
  const std::vector<std::string>& history() const { return history_; }

 private:
  // Keys past the byte values.
  static constexpr int kEof = -1, kUp = 0x100, kDown = 0x101, kLeft = 0x102, kRight = 0x103, kHome = 0x104,
                       kEnd = 0x105, kDelete = 0x106, kNone = 0x107;

  /// Raw mode on a terminal for one read(): no echo, no line buffering, no signals from Ctrl-C/Z/\, no
  /// flow control; output processing stays on ("\n" still starts a new line).
  class RawMode {
   public:
    explicit RawMode(int fd) : fd_(fd) { on(); }
    ~RawMode() { off(); }
    RawMode(const RawMode&) = delete;
    RawMode& operator=(const RawMode&) = delete;
    void on() {
      termios t{};
      if (!::isatty(fd_) || ::tcgetattr(fd_, &t) != 0) return;
      detail::term::saved = t;
      t.c_iflag &= ~tcflag_t(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
      t.c_cflag |= CS8;
      t.c_lflag &= ~tcflag_t(ECHO | ICANON | IEXTEN | ISIG);
      t.c_cc[VMIN] = 1;
      t.c_cc[VTIME] = 0;
      detail::term::raw_fd = fd_;  // before the change: a signal in between restores the saved settings
      ::tcsetattr(fd_, TCSADRAIN, &t);
    }
    void off() { detail::term::restore(); }

   private:
    int fd_;
  };

  // The whole line drawn with `mark` after it, then a new line.
  Result done(Status s, std::string_view mark) {
    pos_ = buf_.size();
    refresh();
    write_out(std::string(mark) + "\r\n");
    return {s, buf_};
  }

  // One byte, kEof at the end of input; SIGINT while waiting reads as Ctrl-C.
  int byte() {
    for (;;) {
      unsigned char c;
      const ssize_t n = ::read(in_, &c, 1);
      if (n == 1) return c;
      if (n < 0 && errno == EINTR) {
        if (detail::term::interrupted) {
          detail::term::interrupted = 0;
          return 3;
        }
        continue;
      }
      return kEof;
    }
  }

  // A byte, or an escape sequence decoded (CSI "ESC [ params final" and SS3 "ESC O x"; modifiers ignored,
  // unknown ones read whole and dropped).
  int key() {
    const int c = byte();
    if (c != 0x1b) return c;
    const int c1 = byte();
    if (c1 == 'O') return arrow(byte());
    if (c1 != '[') return c1 == kEof ? kEof : kNone;  // Alt-<key>: ignored
    std::string params;
    int f = byte();
    while (f >= 0x20 && f <= 0x3f) {
      params += char(f);
      f = byte();
    }
    if (f == kEof) return kEof;
    if (f == '~') {
      const std::string_view p = std::string_view(params).substr(0, params.find(';'));
      if (p == "1" || p == "7") return kHome;
      if (p == "4" || p == "8") return kEnd;
      if (p == "3") return kDelete;
      return kNone;
    }
    return arrow(f);
  }
  static int arrow(int f) {
    switch (f) {
      case 'A':
        return kUp;
      case 'B':
        return kDown;
      case 'C':
        return kRight;
      case 'D':
        return kLeft;
      case 'H':
        return kHome;
      case 'F':
        return kEnd;
      case kEof:
        return kEof;
      default:
        return kNone;
    }
  }

  static bool continuation(unsigned char c) { return (c & 0xc0) == 0x80; }
  std::size_t prev(std::size_t p) const {
    if (p == 0) return 0;
    do --p;
    while (p > 0 && continuation(static_cast<unsigned char>(buf_[p])));
    return p;
  }
  std::size_t next(std::size_t p) const {
    if (p >= buf_.size()) return buf_.size();
    do ++p;
    while (p < buf_.size() && continuation(static_cast<unsigned char>(buf_[p])));
    return p;
  }
  void erase_next() { buf_.erase(pos_, next(pos_) - pos_); }
  void insert(const std::string& s) {
    buf_.insert(pos_, s);
    pos_ += s.size();
  }
  // A UTF-8 sequence from its lead byte (0xc2-0xf4); a malformed one is dropped.
  void insert_utf8(int lead) {
    const int n = lead >= 0xf0 ? 3 : lead >= 0xe0 ? 2 : 1;
    std::string s(1, char(lead));
    for (int i = 0; i < n; ++i) {
      const int c = byte();
      if (c < 0 || !continuation(static_cast<unsigned char>(c))) return;
      s += char(c);
    }
    insert(s);
  }
  // Up (+1) or down (-1) the history, keeping the edits made to the line left.
  void recall(int dir) {
    if ((dir > 0 && idx_ == 0) || (dir < 0 && idx_ + 1 >= work_.size())) return;
    work_[idx_] = buf_;
    idx_ = dir > 0 ? idx_ - 1 : idx_ + 1;
    buf_ = work_[idx_];
    pos_ = buf_.size();
  }

  static std::size_t code_points(std::string_view s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += !continuation(c);
    return n;
  }
  std::size_t columns() const {
    winsize w{};
    if (::ioctl(out_, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
    return 80;
  }
  // Redraws prompt and line: the part of the line around the cursor that fits in the terminal's width
  // (the last column left empty: writing there wraps on some terminals).
  void refresh() {
    const std::size_t pw = code_points(prompt_), cols = columns();
    const std::size_t avail = cols > pw + 2 ? cols - pw - 1 : 1;
    const std::size_t cur = code_points(std::string_view(buf_).substr(0, pos_));
    const std::size_t first = cur >= avail ? cur - avail + 1 : 0;
    std::size_t b = 0;  // byte offset of code point `first`
    for (std::size_t k = 0; k < first; ++k) b = next(b);
    std::size_t e = b;
    for (std::size_t k = 0; k < avail && e < buf_.size(); ++k) e = next(e);
    std::string s = "\r" + prompt_ + buf_.substr(b, e - b) + "\x1b[K\r";
    if (const std::size_t col = pw + cur - first; col > 0) s += "\x1b[" + std::to_string(col) + "C";
    write_out(s);
  }
  void write_out(std::string_view s) const {
    while (!s.empty()) {
      const ssize_t n = ::write(out_, s.data(), s.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      s.remove_prefix(std::size_t(n));
    }
  }

  int in_, out_;
  std::string prompt_, buf_;
  std::size_t pos_ = 0;  // byte offset of the cursor, on a code point boundary
  std::vector<std::string> history_, work_;
  std::size_t idx_ = 0;  // the line of work_ being edited
};

}  // namespace kiln_cli
