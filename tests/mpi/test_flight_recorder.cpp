// The flight recorder on 1-4 ranks: every collective of a RecordingCommunicator recorded with
// the same sequence numbers on every rank, its kind, count, bytes, dtype and bucket; a phase
// left open shows as such; the ring keeps the last K entries; the dump is JSON lines that an
// independent parser (nlohmann-json) reads back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/flight_recorder.hpp"
#include "comm/mpi/mpi_communicator.hpp"
#include "comm/recording_communicator.hpp"

namespace ringtrain {
namespace {

using json = nlohmann::json;

// A directory every rank shares (rank 0 makes it).
std::string shared_dir() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char path[256] = {0};
  if (rank == 0) {
    char dir[] = "/tmp/ringtrain-flight-XXXXXX";
    std::snprintf(path, sizeof path, "%s", mkdtemp(dir));
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

std::vector<json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

comm::FlightRecorder::Identity identity(const comm::Communicator& c) {
  comm::FlightRecorder::Identity who;
  who.rank = c.rank();
  who.world_size = c.size();
  for (int r = 0; r < c.size(); ++r) who.hosts.push_back("host" + std::to_string(r));
  who.job = "test";
  return who;
}

TEST(FlightRecorder, RecordsEveryCollectiveWithTheSameSequenceOnEveryRank) {
  comm::MpiCommunicator mpi(MPI_COMM_WORLD);
  const std::string dir = shared_dir();
  comm::FlightRecorder rec(64, dir, identity(mpi));
  comm::RecordingCommunicator c(mpi, rec);
  rec.set_step(7);
  std::vector<float> v(1000, 1.f);
  {
    const comm::FlightBucket in_bucket(3);
    c.allreduce(v.data(), 1000, DType::f32, comm::ReduceOp::sum);
  }
  int64_t x = c.rank();
  c.broadcast(&x, 1, DType::i64, 0);
  std::vector<uint16_t> send(5, 1), recv(size_t(5 * c.size()));
  c.allgather(send.data(), recv.data(), 5, DType::bf16);
  c.barrier();
  const uint64_t open = rec.begin("reduce", nullptr, -1, 0, DType::f32);  // a phase not left
  const std::string path = rec.dump("test dump");
  rec.end(open);
  ASSERT_EQ(path, dir + "/" + comm::FlightRecorder::file_name(c.rank()));
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 7u) << "header, 4 collectives, 1 phase, end";
  const json& h = lines[0];
  EXPECT_EQ(h["type"], "flight_recorder");
  EXPECT_EQ(h["rank"], c.rank());
  EXPECT_EQ(h["world_size"], c.size());
  EXPECT_EQ(h["reason"], "test dump");
  EXPECT_EQ(h["recorded"], 5);
  EXPECT_EQ(h["hosts"].size(), size_t(c.size()));
  const char* kinds[] = {"allreduce", "broadcast", "allgather", "barrier"};
  const int64_t counts[] = {1000, 1, 5, 0};
  const int64_t bytes[] = {4000, 8, 10, 0};
  for (int i = 0; i < 4; ++i) {
    const json& e = lines[size_t(1 + i)];
    EXPECT_EQ(e["type"], "collective") << "entry " << i;
    EXPECT_EQ(e["seq"], i + 1) << "entry " << i;
    EXPECT_EQ(e["kind"], kinds[i]) << "entry " << i;
    EXPECT_EQ(e["count"], counts[i]) << "entry " << i;
    EXPECT_EQ(e["bytes"], bytes[i]) << "entry " << i;
    EXPECT_EQ(e["step"], 7) << "entry " << i;
    EXPECT_EQ(e["comm"], "mpi") << "entry " << i;
    EXPECT_EQ(e["bucket"], i == 0 ? 3 : -1) << "entry " << i;
    ASSERT_TRUE(e["end"].is_number()) << "entry " << i;
    EXPECT_GE(e["end"].get<double>(), e["start"].get<double>()) << "entry " << i;
  }
  EXPECT_EQ(lines[1]["dtype"], "fp32");
  EXPECT_EQ(lines[3]["dtype"], "bf16");
  EXPECT_EQ(lines[5]["type"], "phase");
  EXPECT_EQ(lines[5]["name"], "reduce");
  EXPECT_TRUE(lines[5]["end"].is_null()) << "the phase had not ended when it was dumped";
  EXPECT_EQ(lines[6]["type"], "end");
  EXPECT_EQ(lines[6]["entries"], 5);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (c.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, KeepsTheLastEntriesOfItsRing) {
  comm::MpiCommunicator mpi(MPI_COMM_WORLD);
  const std::string dir = shared_dir();
  comm::FlightRecorder rec(4, dir, identity(mpi));
  comm::RecordingCommunicator c(mpi, rec);
  int64_t v = 1;
  for (int i = 0; i < 10; ++i) c.allreduce(&v, 1, DType::i64, comm::ReduceOp::sum);
  const auto lines = read_lines(rec.dump("ring"));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0]["recorded"], 10);
  EXPECT_EQ(lines[0]["capacity"], 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(lines[size_t(1 + i)]["seq"], 7 + i) << "entry " << i;
  // dump_final writes once: a second failure path does not overwrite the first one's dump.
  EXPECT_FALSE(rec.dump_final("first").empty());
  EXPECT_TRUE(rec.dump_final("second").empty());
  EXPECT_EQ(read_lines(dir + "/" + comm::FlightRecorder::file_name(c.rank()))[0]["reason"],
            "first");
  MPI_Barrier(MPI_COMM_WORLD);
  if (c.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ringtrain
