// `dattn attend`: JobService.Attend on .npy files (commands.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/limits.h"
#include "client/commands.h"
#include "client/exit_codes.h"
#include "client/format.h"
#include "client/npy.h"
#include "client/printable.h"
#include "client/shared_region.h"

namespace dattn {
namespace client {

int Commands::Attend(const AttendArgs& args) {
  const char* kInputs[] = {"q", "k", "v", "dout"};
  const char* kOutputs[] = {"out", "dq", "dk", "dv"};
  // The inputs: the same dtype and 4-D shape each; the call's shape is theirs.
  std::vector<std::unique_ptr<NpyReader>> inputs;
  for (size_t i = 0; i < args.inputs.size(); ++i) {
    absl::StatusOr<std::unique_ptr<NpyReader>> reader = NpyReader::Open(args.inputs[i]);
    if (!reader.ok()) {
      err_ << "dattn: error: " << kInputs[i] << ": " << Printable(reader.status().message())
           << '\n';
      return kExitUsage;
    }
    const v1::TensorHeader& h = (*reader)->header();
    if (h.shape_size() != 4) {
      err_ << "dattn: error: " << kInputs[i] << " (" << Printable(args.inputs[i]) << ") has "
           << h.shape_size() << " dimensions; attention takes (B, N, H, D) arrays\n";
      return kExitUsage;
    }
    if (!inputs.empty()) {
      const v1::TensorHeader& q = inputs.front()->header();
      if (h.dtype() != q.dtype() || h.shape(0) != q.shape(0) || h.shape(1) != q.shape(1) ||
          h.shape(2) != q.shape(2) || h.shape(3) != q.shape(3)) {
        err_ << "dattn: error: " << kInputs[i] << " (" << Printable(args.inputs[i])
             << ") is not of q's dtype and shape (" << v1::DType_Name(q.dtype()) << " "
             << q.shape(0) << "x" << q.shape(1) << "x" << q.shape(2) << "x" << q.shape(3) << ")\n";
        return kExitUsage;
      }
    }
    inputs.push_back(*std::move(reader));
  }
  v1::AttendStart start = args.start;
  const v1::TensorHeader& q = inputs.front()->header();
  start.set_dtype(q.dtype());
  start.mutable_shape()->set_batch(q.shape(0));
  start.mutable_shape()->set_seq_len(q.shape(1));
  start.mutable_shape()->set_num_heads(q.shape(2));
  start.mutable_shape()->set_head_dim(q.shape(3));
  start.set_backward(inputs.size() == 4);
  const bool backward = inputs.size() == 4;
  const int64_t tensor_bytes = q.total_bytes();

  // --shared-memory: the inputs go into a region of this host, where the workers read them and
  // write the outputs; the call itself carries none.
  std::unique_ptr<SharedRegion> region;
  if (args.shared_memory) {
    absl::StatusOr<std::unique_ptr<SharedRegion>> made =
        SharedRegion::Create((backward ? 8 : 4) * tensor_bytes, "cli");
    if (!made.ok()) {
      err_ << "dattn: error: " << Printable(made.status().message()) << '\n';
      return kExitInternal;
    }
    region = *std::move(made);
    for (size_t i = 0; i < inputs.size(); ++i) {
      char* at = region->data() +
                 SharedRegion::Offset(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_Q + i),
                                      tensor_bytes, backward);
      std::string data;
      for (int64_t offset = 0;; offset += static_cast<int64_t>(data.size())) {
        if (absl::Status s = inputs[i]->Read(api::kMaxOutputChunkBytes, &data); !s.ok()) {
          err_ << "dattn: error: " << Printable(s.message()) << '\n';
          return kExitInternal;
        }
        if (data.empty()) break;
        std::memcpy(at + offset, data.data(), data.size());
      }
    }
    *start.mutable_shared_memory() = region->Place(tensor_bytes, backward);
  }

  grpc::ClientContext context;
  if (args.call_timeout > absl::ZeroDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + args.call_timeout));
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::AttendRequest, v1::AttendResponse>> stream =
      jobs_->Attend(&context);
  // The inputs go out on their own thread, 4 MiB at a time, while the answer is read here.
  absl::Status read_error;
  std::thread writer([&] {
    v1::AttendRequest first;
    *first.mutable_start() = start;
    if (!stream->Write(first)) return;
    for (size_t i = 0; region == nullptr && i < inputs.size(); ++i) {
      for (int64_t offset = 0;;) {
        v1::AttendRequest message;
        v1::AttendChunk* chunk = message.mutable_chunk();
        read_error = inputs[i]->Read(api::kMaxOutputChunkBytes, chunk->mutable_data());
        if (!read_error.ok()) {
          context.TryCancel();
          return;
        }
        if (chunk->data().empty()) break;
        chunk->set_tensor(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_Q + i));
        chunk->set_offset(offset);
        offset += static_cast<int64_t>(chunk->data().size());
        if (!stream->Write(message)) return;
      }
    }
    stream->WritesDone();
  });

  v1::TensorHeader output_header;
  output_header.set_dtype(q.dtype());
  *output_header.mutable_shape() = q.shape();
  output_header.set_total_bytes(q.total_bytes());
  std::vector<std::unique_ptr<NpyWriter>> outputs(4);
  absl::Status write_error;
  v1::AttendResponse response;
  v1::AttendAccepted accepted;
  v1::AttentionJobResult done;
  bool has_done = false;
  while (stream->Read(&response)) {
    if (response.has_accepted()) {
      accepted = response.accepted();
      if (!args_.json) {
        out_ << "Job " << Printable(accepted.job_id()) << " on " << accepted.num_ranks()
             << (accepted.num_ranks() == 1 ? " rank" : " ranks")
             << (region != nullptr ? ": the tensors are in shared memory " : ": sending ")
             << (region != nullptr ? region->name() : "")
             << (region != nullptr
                     ? ""
                     : absl::StrCat(inputs.size(), " x ", FormatBytes(q.total_bytes())))
             << '\n'
             << std::flush;
      }
    } else if (response.has_chunk()) {
      const int t = response.chunk().tensor() - v1::ATTEND_TENSOR_OUT;
      if (t < 0 || t >= 4 || !write_error.ok()) continue;
      const std::string& path = args.outputs[static_cast<size_t>(t)];
      if (path.empty()) continue;  // Not asked to keep this one.
      if (outputs[static_cast<size_t>(t)] == nullptr) {
        absl::StatusOr<std::unique_ptr<NpyWriter>> opened = NpyWriter::Open(path, output_header);
        if (!opened.ok()) {
          write_error = opened.status();
          context.TryCancel();
          continue;
        }
        outputs[static_cast<size_t>(t)] = *std::move(opened);
      }
      write_error = outputs[static_cast<size_t>(t)]->Append(response.chunk().data());
      if (!write_error.ok()) context.TryCancel();
    } else if (response.has_done()) {
      done = response.done();
      has_done = true;
    }
  }
  const grpc::Status status = stream->Finish();
  writer.join();
  if (!read_error.ok()) {
    err_ << "dattn: error: " << Printable(read_error.message()) << '\n';
    return kExitInternal;
  }
  if (!write_error.ok()) {
    err_ << "dattn: error: " << Printable(write_error.message()) << '\n';
    return kExitInternal;
  }
  if (!status.ok()) return RpcFailed(status, "attend");
  if (!has_done) {
    err_ << "dattn: error: the call ended without its result\n";
    return kExitInternal;
  }
  if (region != nullptr) {
    // The outputs are in the region: saved from there.
    for (int t = 0; t < (backward ? 4 : 1); ++t) {
      const std::string& path = args.outputs[static_cast<size_t>(t)];
      if (path.empty()) continue;
      absl::StatusOr<std::unique_ptr<NpyWriter>> opened = NpyWriter::Open(path, output_header);
      absl::Status s = opened.status();
      const char* at =
          region->data() +
          SharedRegion::Offset(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_OUT + t),
                               tensor_bytes, backward);
      for (int64_t offset = 0; s.ok() && offset < tensor_bytes;
           offset += api::kMaxOutputChunkBytes) {
        s = (*opened)->Append(
            std::string(at + offset, static_cast<size_t>(std::min<int64_t>(
                                         api::kMaxOutputChunkBytes, tensor_bytes - offset))));
      }
      if (!s.ok()) {
        err_ << "dattn: error: " << kOutputs[t] << ": " << Printable(s.message()) << '\n';
        return kExitInternal;
      }
      outputs[static_cast<size_t>(t)] = *std::move(opened);
    }
  }
  for (size_t t = 0; t < outputs.size(); ++t) {
    if (outputs[t] == nullptr) continue;
    if (absl::Status s = outputs[t]->Finish(); !s.ok()) {
      err_ << "dattn: error: " << kOutputs[t] << ": " << Printable(s.message()) << '\n';
      return kExitInternal;
    }
  }
  if (args_.json) {
    PrintJson(done);
    return kExitOk;
  }
  out_ << absl::StrFormat("Done: %.6g s on the engine (slowest rank), %.4g TFLOP/s\n",
                          done.seconds_per_step(), done.tflops());
  for (size_t t = 0; t < outputs.size(); ++t) {
    if (outputs[t] != nullptr) {
      out_ << "Saved " << kOutputs[t] << " to " << Printable(args.outputs[t]) << '\n';
    }
  }
  out_ << std::flush;
  return kExitOk;
}

}  // namespace client
}  // namespace dattn
