// The Fashion-MNIST IDX reader on small files written here: good files (gzip and plain),
// truncated ones, corrupted gzip streams, wrong headers and mismatched pairs; and, when
// Debian's dataset-fashion-mnist is installed, the real files.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fmnist/dataset.hpp"

namespace fs = std::filesystem;

namespace {

// A scratch directory removed at the end of the test case.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("gravac_idx_test_" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  [[nodiscard]] std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<unsigned char> idx_bytes(unsigned char type, const std::vector<std::uint32_t>& dims,
                                     const std::vector<unsigned char>& data) {
  std::vector<unsigned char> b{0, 0, type, static_cast<unsigned char>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

void write_plain(const std::string& path, const std::vector<unsigned char>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_gz(const std::string& path, const std::vector<unsigned char>& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<unsigned char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// n images of r x c pixels with pseudo-random values, and n labels.
std::vector<unsigned char> pixels(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(count);
  for (auto& x : v) x = static_cast<unsigned char>(rng() & 0xff);
  return v;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const fmnist::data_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("idx: a good gzip file and a good plain file read back exactly") {
  scratch_dir dir;
  const auto data = pixels(5 * 4 * 3, 1);
  const auto bytes = idx_bytes(0x08, {5, 4, 3}, data);
  write_gz(dir.file("img.gz"), bytes);
  write_plain(dir.file("img.raw"), bytes);
  for (const auto* name : {"img.gz", "img.raw"}) {
    const auto a = fmnist::read_idx_u8(dir.file(name), 3);
    CHECK(a.dims == std::vector<std::uint32_t>{5, 4, 3});
    CHECK(a.items() == 5);
    CHECK(a.item_size() == 12);
    CHECK(a.data == data);
  }
}

TEST_CASE("idx: an image/label pair becomes floats in [0, 1] with labels") {
  scratch_dir dir;
  auto data = pixels(3 * 2 * 2, 2);
  data[0] = 255;
  data[1] = 0;
  write_gz(dir.file("i.gz"), idx_bytes(0x08, {3, 2, 2}, data));
  write_gz(dir.file("l.gz"), idx_bytes(0x08, {3}, {7, 0, 9}));
  const auto d = fmnist::load_idx_pair(dir.file("i.gz"), dir.file("l.gz"));
  CHECK(d.n == 3);
  CHECK(d.rows == 2);
  CHECK(d.cols == 2);
  CHECK(d.labels == std::vector<int>{7, 0, 9});
  CHECK(d.pixels[0] == 1.0f);
  CHECK(d.pixels[1] == 0.0f);
  CHECK(d.pixels[5] == Approx(data[5] / 255.0f));
}

TEST_CASE("idx: truncated files are refused and say so") {
  scratch_dir dir;
  const auto bytes = idx_bytes(0x08, {10, 4, 4}, pixels(160, 3));
  SECTION("data cut short (plain)") {
    write_plain(dir.file("t.raw"), {bytes.begin(), bytes.end() - 7});
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("t.raw"), 3); }), Catch::Contains("truncated"));
  }
  SECTION("data cut short (inside a valid gzip stream)") {
    write_gz(dir.file("t.gz"), {bytes.begin(), bytes.end() - 1});
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("t.gz"), 3); }), Catch::Contains("truncated"));
  }
  SECTION("gzip stream itself cut short") {
    write_gz(dir.file("full.gz"), bytes);
    auto gz = read_all(dir.file("full.gz"));
    gz.resize(gz.size() / 2);
    write_plain(dir.file("half.gz"), gz);
    const auto msg = error_of([&] { fmnist::read_idx_u8(dir.file("half.gz"), 3); });
    CHECK_THAT(msg, Catch::Contains("truncated"));
    CHECK_THAT(msg, Catch::Contains("half.gz"));
  }
  SECTION("header cut short") {
    write_plain(dir.file("h.raw"), {bytes.begin(), bytes.begin() + 9});
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("h.raw"), 3); }), Catch::Contains("header is truncated"));
  }
  SECTION("empty file") {
    write_plain(dir.file("e.raw"), {});
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("e.raw"), 3); }), Catch::Contains("too short"));
  }
}

TEST_CASE("idx: corrupted files are refused") {
  scratch_dir dir;
  const auto bytes = idx_bytes(0x08, {64, 8, 8}, pixels(64 * 64, 4));
  SECTION("bytes flipped inside the gzip stream") {
    write_gz(dir.file("c.gz"), bytes);
    auto gz = read_all(dir.file("c.gz"));
    // Past the 10-byte gzip header, inside the deflate data and before the CRC trailer.
    for (std::size_t i = 20; i < gz.size() - 12; i += 7) gz[i] ^= 0x5a;
    write_plain(dir.file("c.gz"), gz);
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("c.gz"), 3); }), Catch::Contains("corrupt"));
  }
  SECTION("wrong magic number") {
    auto b = bytes;
    b[0] = 0x1f;
    write_plain(dir.file("m.raw"), b);
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("m.raw"), 3); }), Catch::Contains("not an IDX file"));
  }
  SECTION("wrong data type") {
    write_plain(dir.file("t.raw"), idx_bytes(0x0D, {2, 2, 2}, std::vector<unsigned char>(32)));
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("t.raw"), 3); }), Catch::Contains("not unsigned byte"));
  }
  SECTION("wrong number of dimensions") {
    write_plain(dir.file("d.raw"), idx_bytes(0x08, {4}, {1, 2, 3, 4}));
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("d.raw"), 3); }),
               Catch::Contains("1 dimensions, expected 3"));
  }
  SECTION("a zero dimension") {
    write_plain(dir.file("z.raw"), idx_bytes(0x08, {3, 0, 2}, {}));
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("z.raw"), 3); }), Catch::Contains("is zero"));
  }
  SECTION("an absurd size") {
    write_plain(dir.file("s.raw"), idx_bytes(0x08, {0xffffffffu, 0xffffffffu, 2}, {}));
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("s.raw"), 3); }), Catch::Contains("implausibly large"));
  }
  SECTION("trailing bytes") {
    auto b = bytes;
    b.push_back(0);
    write_gz(dir.file("x.gz"), b);
    CHECK_THAT(error_of([&] { fmnist::read_idx_u8(dir.file("x.gz"), 3); }), Catch::Contains("trailing"));
  }
}

TEST_CASE("idx: mismatched pairs, bad labels and missing files are explained") {
  scratch_dir dir;
  write_gz(dir.file("i.gz"), idx_bytes(0x08, {3, 2, 2}, pixels(12, 5)));
  SECTION("label count differs from image count") {
    write_gz(dir.file("l.gz"), idx_bytes(0x08, {2}, {1, 2}));
    CHECK_THAT(error_of([&] { fmnist::load_idx_pair(dir.file("i.gz"), dir.file("l.gz")); }),
               Catch::Contains("holds 2 labels but"));
  }
  SECTION("label outside 0..9") {
    write_gz(dir.file("l.gz"), idx_bytes(0x08, {3}, {1, 12, 2}));
    CHECK_THAT(error_of([&] { fmnist::load_idx_pair(dir.file("i.gz"), dir.file("l.gz")); }),
               Catch::Contains("outside 0..9"));
  }
  SECTION("missing file names the package") {
    const auto msg = error_of([&] { fmnist::load_fashion_mnist(dir.file("nowhere"), fmnist::split::test); });
    CHECK_THAT(msg, Catch::Contains("dataset-fashion-mnist"));
    CHECK_THAT(msg, Catch::Contains("t10k-images-idx3-ubyte.gz"));
  }
  SECTION("images of the wrong size are not Fashion-MNIST") {
    fs::create_directories(dir.path / "fm");
    write_gz((dir.path / "fm" / "t10k-images-idx3-ubyte.gz").string(), idx_bytes(0x08, {3, 2, 2}, pixels(12, 6)));
    write_gz((dir.path / "fm" / "t10k-labels-idx1-ubyte.gz").string(), idx_bytes(0x08, {3}, {0, 1, 2}));
    CHECK_THAT(error_of([&] { fmnist::load_fashion_mnist((dir.path / "fm").string(), fmnist::split::test); }),
               Catch::Contains("28 x 28"));
  }
}

TEST_CASE("idx: the installed Fashion-MNIST test split, when present") {
  const std::string dir = fmnist::default_data_dir;
  if (!fs::exists(dir + "/t10k-images-idx3-ubyte.gz")) {
    WARN("dataset-fashion-mnist is not installed; skipping the real-file check");
    return;
  }
  const auto d = fmnist::load_fashion_mnist(dir, fmnist::split::test);
  CHECK(d.n == 10000);
  CHECK(d.pixels.size() == 10000u * 784u);
  std::vector<int> per_class(10, 0);
  for (int y : d.labels) ++per_class[static_cast<std::size_t>(y)];
  for (int c : per_class) CHECK(c == 1000);  // the test split is balanced
}
