// parse_integer / parse_number (core/numbers.hpp): the one path from text to numbers for flags, config values and
// checkpoint metadata; each doc example is checked here.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "branchgrpo/core/numbers.hpp"
#include "error_text.hpp"

using branchgrpo::echo_text;
using branchgrpo::parse_integer;
using branchgrpo::parse_number;
using branchgrpo::zero_padded;
using branchgrpo::testing::error_of;
namespace bg = branchgrpo;

TEST_CASE("parse_integer accepts exactly the representable decimal integers", "[numbers][reliability]") {
  CHECK(parse_integer<int>("42", "--iters") == 42);
  CHECK(parse_integer<int>("-42", "k") == -42);
  CHECK(parse_integer<int>("007", "k") == 7);
  CHECK(parse_integer<std::uint64_t>("18446744073709551615", "--seed") == UINT64_MAX);
  CHECK(error_of([] { (void)parse_integer<std::uint64_t>("-1", "--seed"); }) ==
        "--seed = -1: must be an integer in [0, 18446744073709551615]");
  CHECK(error_of([] { (void)parse_integer<std::uint64_t>("18446744073709551616", "--seed"); }) ==
        "--seed = 18446744073709551616: must be an integer in [0, 18446744073709551615]");
  CHECK(error_of([] { (void)parse_integer<int>("0", "--threads", 1, 256); }) ==
        "--threads = 0: must be an integer in [1, 256]");
  for (const char* bad : {"", " 1", "1 ", "+1", "0x10", "1e3", "1.0", "12a", "--1"})
    CHECK(error_of([&] { (void)parse_integer<int>(bad, "k"); }) ==
          "k = " + std::string(bad) + ": must be an integer in [-2147483648, 2147483647]");
}

TEST_CASE("parse_number accepts finite decimal numbers only", "[numbers][reliability]") {
  CHECK(parse_number("1e-4", "--lr") == 1e-4);
  CHECK(parse_number("-3", "x") == -3.0);
  CHECK(parse_number("0.5", "x") == 0.5);
  for (const char* bad : {"1e999", "nan", "inf", "", "0x1p3", "1,5", " 1", "1e"})
    CHECK(error_of([&] { (void)parse_number(bad, "--lr"); }) ==
          "--lr = " + std::string(bad) + ": must be a finite number");
}

TEST_CASE("zero_padded pads to a width and never cuts", "[numbers]") {
  CHECK(zero_padded(10, 6) == "000010");
  CHECK(zero_padded(1234567, 6) == "1234567");
  CHECK(zero_padded(0, 0) == "0");
  CHECK(zero_padded(7, 5) == "00007");
  CHECK(error_of([] { (void)zero_padded(-1, 3); }) == "zero_padded(-1): a negative number");
}

TEST_CASE("error messages echo at most 32 characters of the input", "[numbers][reliability]") {
  CHECK(echo_text(std::string(300, '9')) == std::string(29, '9') + "...");
  CHECK(echo_text("12") == "12");
  CHECK(error_of([] { (void)parse_integer<int>(std::string(300, '9'), "--x"); }) ==
        "--x = " + std::string(29, '9') + "...: must be an integer in [-2147483648, 2147483647]");
}

TEST_CASE("parse_number with a range, and the bounds as messages show them", "[numbers][reliability]") {
  CHECK(bg::parse_number("0.5", "--eta", 1e-4, 10) == 0.5);
  CHECK(bg::parse_number("10", "--eta", 1e-4, 10) == 10);
  CHECK(error_of([] { (void)bg::parse_number("5e-324", "--lr", 1e-12, 1); }) ==
        "--lr = 5e-324: must be a number in [1e-12, 1]");
  CHECK(error_of([] { (void)bg::parse_number("1e300", "--lr", 1e-12, 1); }) ==
        "--lr = 1e300: must be a number in [1e-12, 1]");
  CHECK(error_of([] { (void)bg::parse_number("inf", "--lr", 1e-12, 1); }) == "--lr = inf: must be a finite number");
  CHECK(bg::number_bound_text(0.0001) == "0.0001");
  CHECK(bg::number_bound_text(1e6) == "1000000");
  CHECK(bg::number_bound_text(1e-6) == "1e-6");
  CHECK(bg::number_bound_text(1e300) == "1e300");
  CHECK(bg::number_bound_text(-1e3) == "-1000");
  CHECK(bg::number_bound_text(86400) == "86400");
  CHECK(bg::number_bound_text(0) == "0");
}

TEST_CASE("echo_middle keeps the start and the end", "[numbers][reliability]") {
  CHECK(bg::echo_middle("abcdefghij", 7) == "ab...ij");
  CHECK(bg::echo_middle("abc", 7) == "abc");
  CHECK(bg::echo_middle(std::string(52'000'000, 'x'), 80).size() == 80);
}

TEST_CASE("echoes escape every control character, NUL included, and never cut an escape", "[numbers][reliability]") {
  using namespace std::string_literals;
  // The doc examples: a NUL would have ended the message (what() is a C string), a newline split the line.
  CHECK(echo_text("a\0b"s) == "a\\x00b");
  CHECK(bg::echo_middle("a red\0circle"s, 80) == "a red\\x00circle");
  CHECK(echo_text("a\nb\tc\rd\x1b[31m\x7f") == "a\\nb\\tc\\rd\\x1b[31m\\x7f");
  // Every control character, and nothing else, is escaped; UTF-8 bytes pass.
  for (int c = 0; c < 256; ++c) {
    const std::string echoed = echo_text(std::string(1, static_cast<char>(c)));
    const bool control = c < 0x20 || c == 0x7F;
    CHECK((echoed.size() > 1) == control);
    CHECK(echoed.find_first_of("\0\n\r"s) == std::string::npos);
  }
  CHECK(echo_text("caf\xc3\xa9") == "caf\xc3\xa9");
  // The limits count the escapes: 32 characters in all, the "..." included, and an escape stays whole.
  const std::string nuls(100, '\0');
  CHECK(echo_text(nuls) == "\\x00\\x00\\x00\\x00\\x00\\x00\\x00...");  // 7 escapes (28) + "..." (31 <= 32)
  CHECK(echo_text(nuls).size() <= 32);
  CHECK(bg::echo_middle(nuls, 20) == "\\x00\\x00...\\x00\\x00");
  CHECK(bg::echo_middle("abc\0"s, 7) == "abc\\x00");
  CHECK(bg::echo_middle("abcde\0"s, 7) == "ab...");  // the tail has room for 2 characters: no whole escape fits
  // A message built from an echo holds the whole value: the line no longer ends at the NUL.
  CHECK(error_of([] { (void)parse_integer<int>("4\0002"s, "--x"); }) ==
        "--x = 4\\x002: must be an integer in [-2147483648, 2147483647]");
}
