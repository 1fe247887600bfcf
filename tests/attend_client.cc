#include "tests/attend_client.h"

#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/half_float.h"

namespace dattn::testing {

AttendAnswer CallAttend(v1::JobService::Stub& stub, const v1::AttendStart& start,
                        const std::vector<std::string>& inputs, int64_t chunk,
                        std::chrono::seconds timeout) {
  const auto begin = std::chrono::steady_clock::now();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  std::unique_ptr<grpc::ClientReaderWriter<v1::AttendRequest, v1::AttendResponse>> stream =
      stub.Attend(&context);
  AttendAnswer answer;
  std::thread writer([&] {
    v1::AttendRequest first;
    *first.mutable_start() = start;
    if (!stream->Write(first)) return;
    for (size_t t = 0; t < inputs.size(); ++t) {
      for (int64_t at = 0; at < static_cast<int64_t>(inputs[t].size()); at += chunk) {
        v1::AttendRequest message;
        v1::AttendChunk* c = message.mutable_chunk();
        c->set_tensor(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_Q + t));
        c->set_offset(at);
        c->set_data(inputs[t].substr(static_cast<size_t>(at), static_cast<size_t>(chunk)));
        if (!stream->Write(message)) return;
      }
    }
    stream->WritesDone();
  });
  v1::AttendResponse response;
  while (stream->Read(&response)) {
    switch (response.message_case()) {
      case v1::AttendResponse::kAccepted:
        answer.accepted = response.accepted();
        break;
      case v1::AttendResponse::kChunk: {
        const v1::AttendChunk& c = response.chunk();
        const int t = c.tensor() - v1::ATTEND_TENSOR_OUT;
        if (t < 0 || t > 3) {
          answer.protocol_error = absl::StrCat("an output chunk of tensor ", c.tensor());
          break;
        }
        if (answer.outputs.size() <= static_cast<size_t>(t)) answer.outputs.resize(t + 1);
        std::string& out = answer.outputs[static_cast<size_t>(t)];
        if (c.offset() != static_cast<int64_t>(out.size()) || c.data().size() > (4u << 20)) {
          answer.protocol_error = absl::StrCat("output ", t, " chunk at ", c.offset(), " of ",
                                               c.data().size(), " bytes after ", out.size());
        }
        out += c.data();
        break;
      }
      case v1::AttendResponse::kDone:
        answer.done = response.done();
        answer.has_done = true;
        break;
      default:
        answer.protocol_error = "an empty response";
    }
  }
  answer.status = stream->Finish();
  writer.join();
  answer.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return answer;
}

std::string EncodeElements(const std::vector<double>& values, v1::DType dtype) {
  std::string bytes;
  switch (dtype) {
    case v1::DTYPE_FP64:
      bytes.resize(values.size() * 8);
      std::memcpy(bytes.data(), values.data(), bytes.size());
      break;
    case v1::DTYPE_FP32: {
      std::vector<float> f(values.begin(), values.end());
      bytes.resize(f.size() * 4);
      std::memcpy(bytes.data(), f.data(), bytes.size());
      break;
    }
    default: {
      std::vector<uint16_t> h(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        h[i] = dtype == v1::DTYPE_FP16 ? worker::DoubleToHalfBits(values[i])
                                       : worker::DoubleToBFloat16Bits(values[i]);
      }
      bytes.resize(h.size() * 2);
      std::memcpy(bytes.data(), h.data(), bytes.size());
    }
  }
  return bytes;
}

std::vector<double> DecodeElements(const std::string& bytes, v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP64: {
      std::vector<double> d(bytes.size() / 8);
      std::memcpy(d.data(), bytes.data(), d.size() * 8);
      return d;
    }
    case v1::DTYPE_FP32: {
      std::vector<float> f(bytes.size() / 4);
      std::memcpy(f.data(), bytes.data(), f.size() * 4);
      return std::vector<double>(f.begin(), f.end());
    }
    default: {
      std::vector<uint16_t> h(bytes.size() / 2);
      std::memcpy(h.data(), bytes.data(), h.size() * 2);
      std::vector<double> d(h.size());
      for (size_t i = 0; i < h.size(); ++i) {
        d[i] = dtype == v1::DTYPE_FP16 ? worker::HalfBitsToDouble(h[i])
                                       : worker::BFloat16BitsToDouble(h[i]);
      }
      return d;
    }
  }
}

}  // namespace dattn::testing
