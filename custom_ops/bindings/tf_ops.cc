// TensorFlow binding of the collective core: op registrations with shape
// functions, and AsyncOpKernels that hand tensors to the core and return;
// the core completes them through a callback. This is the only file that
// includes TensorFlow headers.
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../engine/runtime.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;

constexpr char kTypes[] =
    "{half, bfloat16, float, double, int32, int64, uint8, int8, int16, uint16, bool}";

absl::Status ToTf(const ddl::Status& s) {
  switch (s.code()) {
    case ddl::Status::Code::kOk:
      return absl::OkStatus();
    case ddl::Status::Code::kInvalidArgument:
      return absl::InvalidArgumentError(s.message());
    case ddl::Status::Code::kAborted:
      return absl::AbortedError(s.message());
    case ddl::Status::Code::kFailedPrecondition:
      return absl::FailedPreconditionError(s.message());
    case ddl::Status::Code::kDeadlineExceeded:
      return absl::DeadlineExceededError(s.message());
    case ddl::Status::Code::kInternal:
      break;
  }
  return absl::InternalError(s.message());
}

bool ToDdl(DataType t, ddl::DataType* out) {
  switch (t) {
    case DT_HALF: *out = ddl::DataType::kFloat16; return true;
    case DT_BFLOAT16: *out = ddl::DataType::kBFloat16; return true;
    case DT_FLOAT: *out = ddl::DataType::kFloat32; return true;
    case DT_DOUBLE: *out = ddl::DataType::kFloat64; return true;
    case DT_INT32: *out = ddl::DataType::kInt32; return true;
    case DT_INT64: *out = ddl::DataType::kInt64; return true;
    case DT_UINT8: *out = ddl::DataType::kUInt8; return true;
    case DT_INT8: *out = ddl::DataType::kInt8; return true;
    case DT_INT16: *out = ddl::DataType::kInt16; return true;
    case DT_UINT16: *out = ddl::DataType::kUInt16; return true;
    case DT_BOOL: *out = ddl::DataType::kBool; return true;
    default: return false;
  }
}

// A result the core placed in memory of its own (node shared memory, which
// the other local ranks' outputs view too): the core's handle, not a
// TensorFlow allocator, keeps it alive for as long as any tensor views it.
// It does not count as owning its memory, so TensorFlow never hands it to
// an op that would overwrite it in place.
class CoreOwnedBuffer : public TensorBuffer {
 public:
  CoreOwnedBuffer(void* data, size_t bytes, std::shared_ptr<void> hold)
      : TensorBuffer(data), bytes_(bytes), hold_(std::move(hold)) {}
  size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocated_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocator_name("keras_ddl_shared_memory");
  }
  bool OwnsMemory() const override { return false; }

 private:
  size_t bytes_;
  std::shared_ptr<void> hold_;
};

absl::Status SameShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_inputs() - 1; ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

absl::Status UnknownFirstDim(InferenceContext* c) {
  shape_inference::ShapeHandle out;
  if (c->RankKnown(c->input(0)) && c->Rank(c->input(0)) == 0) {
    c->set_output(0, c->Vector(c->UnknownDim()));  // a scalar gathers to a vector
    return absl::OkStatus();
  }
  TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

// Every op takes its collective's name as a trailing scalar string input so
// eager calls with fresh names reuse one cached kernel; an empty name means
// "use this node's name", which is deterministic across ranks in a graph.
// wire_dtype: -1 sends the tensor as it is; kFloat16 (0) or kBFloat16 (1)
// sends a float32 tensor in that dtype (Compression.fp16 / bf16): the core
// converts as it packs and unpacks, and sums across nodes in it.
// eager: the op runs eagerly, so its caller waits for it anyway; the
// kernel's thread may then run the engine's cycles itself (runtime.h).
REGISTER_OP("DdlAllreduce")
    .Attr("process_set: int = 0")
    .Attr(std::string("T: ") + kTypes)
    .Attr("reduce_op: int")
    .Attr("wire_dtype: int = -1")
    .Attr("eager: bool = false")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("reduced: T")
    .SetShapeFn(SameShapes);

REGISTER_OP("DdlGroupedAllreduce")
    .Attr("process_set: int = 0")
    .Attr(std::string("T: list(") + kTypes + ") >= 1")
    .Attr("reduce_op: int")
    .Attr("wire_dtype: int = -1")
    .Attr("eager: bool = false")
    .Input("tensors: T")
    .Input("tensor_name: string")
    .Output("reduced: T")
    .SetShapeFn(SameShapes);

REGISTER_OP("DdlAllgather")
    .Attr("process_set: int = 0")
    .Attr(std::string("T: ") + kTypes)
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("gathered: T")
    .SetShapeFn(UnknownFirstDim);

REGISTER_OP("DdlBroadcast")
    .Attr("process_set: int = 0")
    .Attr(std::string("T: ") + kTypes)
    .Attr("root_rank: int")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("broadcast: T")
    .SetShapeFn(SameShapes);

REGISTER_OP("DdlReducescatter")
    .Attr("process_set: int = 0")
    .Attr(std::string("T: ") + kTypes)
    .Attr("reduce_op: int")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("scattered: T")
    .SetShapeFn(UnknownFirstDim);

// splits: rows of axis 0 for each rank (empty: an even split). Checked by
// the core in negotiation, so a bad value fails every rank, not this one.
REGISTER_OP("DdlAlltoall")
    .Attr("process_set: int = 0")
    .Attr(std::string("T: ") + kTypes)
    .Input("tensor: T")
    .Input("splits: int64")
    .Input("tensor_name: string")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      // A scalar is refused in negotiation (on every rank), not here.
      if (c->RankKnown(c->input(0)) && c->Rank(c->input(0)) == 0) {
        c->set_output(0, c->UnknownShape());
      } else {
        shape_inference::ShapeHandle out;
        TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &out));
        c->set_output(0, out);
      }
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("DdlBarrier")
    .Attr("process_set: int = 0")
    .Input("tensor_name: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext*) { return absl::OkStatus(); });

REGISTER_OP("DdlJoin")
    .Attr("process_set: int = 0")
    .Output("last_joined: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

class CollectiveKernel : public AsyncOpKernel {
 public:
  CollectiveKernel(OpKernelConstruction* c, ddl::Collective collective)
      : AsyncOpKernel(c), collective_(collective) {
    if (c->HasAttr("reduce_op")) {
      int op = 0;
      OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
      OP_REQUIRES(c, ddl::IsValidReduceOp(op),
                  absl::InvalidArgumentError("reduce_op=" + std::to_string(op) +
                                             " is not one of Sum, Average, Min, Max, Product"));
      op_ = static_cast<ddl::ReduceOp>(op);
    }
    if (c->HasAttr("root_rank")) OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set", &process_set_));
    if (c->HasAttr("eager")) OP_REQUIRES_OK(c, c->GetAttr("eager", &eager_));
    if (c->HasAttr("wire_dtype")) {
      OP_REQUIRES_OK(c, c->GetAttr("wire_dtype", &wire_));
      OP_REQUIRES(c, wire_ == -1 || wire_ == static_cast<int>(ddl::DataType::kFloat16) ||
                         wire_ == static_cast<int>(ddl::DataType::kBFloat16),
                  absl::InvalidArgumentError("wire_dtype=" + std::to_string(wire_) +
                                             " is not -1 (none), float16 or bfloat16"));
    }
  }

 protected:
  std::string CollectiveName(OpKernelContext* ctx) const {
    const Tensor& t = ctx->input(ctx->num_inputs() - 1);
    std::string given = t.NumElements() == 1 ? std::string(t.scalar<tstring>()()) : "";
    return given.empty() ? name() : given;
  }

  // Builds the core's description of input `index`; fails the op on an
  // unsupported dtype.
  absl::Status Describe(OpKernelContext* ctx, int index, const std::string& name,
                        ddl::Work* w) const {
    const Tensor& in = ctx->input(index);
    if (!ToDdl(in.dtype(), &w->dtype)) {
      return absl::InvalidArgumentError("unsupported dtype " + DataTypeString(in.dtype()) +
                                        " for tensor '" + name + "'");
    }
    w->name = name;
    w->collective = collective_;
    w->op = op_;
    w->wire = wire_ < 0 ? w->dtype : static_cast<ddl::DataType>(wire_);
    w->root = root_;
    for (int d = 0; d < in.dims(); ++d) w->shape.push_back(in.dim_size(d));
    w->input = in.data();
    return absl::OkStatus();
  }

  // A done callback shared by a group: the op completes when all members do.
  static std::function<void(const ddl::Status&)> Completion(OpKernelContext* ctx,
                                                           DoneCallback done, int members) {
    struct Group {
      std::atomic<int> remaining;
      DoneCallback done;
      std::mutex mutex;
      ddl::Status first_error;
    };
    auto group = std::make_shared<Group>();
    group->remaining = members;
    group->done = std::move(done);
    return [ctx, group](const ddl::Status& s) {
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(group->mutex);
        if (group->first_error.ok()) group->first_error = s;
      }
      if (--group->remaining == 0) {
        if (!group->first_error.ok()) ctx->SetStatus(ToTf(group->first_error));
        group->done();
      }
    };
  }

  // Allocates output `index` when the core asks; `reuse_input` lets it take
  // over input `index`'s buffer when nothing else holds it.
  static std::function<ddl::Status(const std::vector<int64_t>&, void**)> Allocator(
      OpKernelContext* ctx, int index = 0, bool reuse_input = false) {
    return [ctx, index, reuse_input](const std::vector<int64_t>& shape, void** data) {
      TensorShape ts;
      for (int64_t d : shape) ts.AddDim(d);
      Tensor* out = nullptr;
      absl::Status s = reuse_input
                           ? ctx->forward_input_or_allocate_output({index}, index, ts, &out)
                           : ctx->allocate_output(index, ts, &out);
      if (!s.ok()) return ddl::Status::Internal(std::string(s.message()));
      *data = out->data();
      return ddl::Status::Ok();
    };
  }

  // Makes a core-owned result output `index`, with input `index`'s shape.
  static std::function<void(void*, std::shared_ptr<void>)> Adopter(OpKernelContext* ctx,
                                                                   int index) {
    return [ctx, index](void* data, std::shared_ptr<void> hold) {
      const Tensor& in = ctx->input(index);
      auto* buffer = new CoreOwnedBuffer(data, in.TotalBytes(), std::move(hold));
      Tensor out(in.dtype(), in.shape(), buffer);
      buffer->Unref();  // `out` holds its own reference
      ctx->set_output(index, out);
    };
  }

  ddl::Collective collective_;
  ddl::ReduceOp op_ = ddl::ReduceOp::kSum;
  int root_ = 0;
  int wire_ = -1;
  int process_set_ = 0;  // 0: every rank (see runtime.h)
  bool eager_ = false;   // the caller waits for the op: it may drive the engine
};

// Allreduce and broadcast: output has the input's shape. Broadcast's is
// allocated here; allreduce's when the core knows where the result goes
// (its own shared memory, or a buffer allocated on request).
class SameShapeKernel : public CollectiveKernel {
 public:
  SameShapeKernel(OpKernelConstruction* c, ddl::Collective collective)
      : CollectiveKernel(c, collective) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int members = ctx->num_inputs() - 1;
    const std::string base = CollectiveName(ctx);
    std::vector<ddl::Work> works(members);
    for (int i = 0; i < members; ++i) {
      std::string name = members == 1 ? base : base + "." + std::to_string(i);
      OP_REQUIRES_OK_ASYNC(ctx, Describe(ctx, i, name, &works[i]), done);
      if (collective_ == ddl::Collective::kAllreduce) {
        works[i].allocate = Allocator(ctx, i, /*reuse_input=*/true);
        works[i].adopt = Adopter(ctx, i);
        continue;
      }
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(
          ctx, ctx->forward_input_or_allocate_output({i}, i, ctx->input(i).shape(), &out), done);
      works[i].output = out->data();
    }
    auto completion = Completion(ctx, std::move(done), members);
    for (auto& w : works) w.done = completion;
    ddl::Submit(std::move(works), process_set_, eager_);
  }
};

// Allgather and reducescatter: the core allocates once it knows the shape.
class CoreShapedKernel : public CollectiveKernel {
 public:
  CoreShapedKernel(OpKernelConstruction* c, ddl::Collective collective)
      : CollectiveKernel(c, collective) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::vector<ddl::Work> works(1);
    OP_REQUIRES_OK_ASYNC(ctx, Describe(ctx, 0, CollectiveName(ctx), &works[0]), done);
    works[0].allocate = Allocator(ctx);
    works[0].done = Completion(ctx, std::move(done), 1);
    ddl::Submit(std::move(works), process_set_);
  }
};

// Alltoall: the core exchanges the splits, then asks for both outputs
// (the rows received, and how many came from each rank) before the data.
class AlltoallKernel : public CollectiveKernel {
 public:
  AlltoallKernel(OpKernelConstruction* c, ddl::Collective collective)
      : CollectiveKernel(c, collective) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::vector<ddl::Work> works(1);
    ddl::Work& w = works[0];
    OP_REQUIRES_OK_ASYNC(ctx, Describe(ctx, 0, CollectiveName(ctx), &w), done);
    const Tensor& splits = ctx->input(1);
    if (splits.dims() != 1) {
      w.invalid = "splits must be a 1-D tensor, got shape " + splits.shape().DebugString();
    } else {
      auto v = splits.flat<int64_t>();
      w.splits.assign(v.data(), v.data() + v.size());
    }
    w.allocate = Allocator(ctx, 0);
    w.received_splits = [ctx](const std::vector<int64_t>& rows) {
      Tensor* out = nullptr;
      absl::Status s =
          ctx->allocate_output(1, TensorShape({static_cast<int64_t>(rows.size())}), &out);
      if (!s.ok()) return ddl::Status::Internal(std::string(s.message()));
      auto flat = out->flat<int32>();
      for (size_t r = 0; r < rows.size(); ++r) {
        if (rows[r] > std::numeric_limits<int32>::max()) {
          return ddl::Status::InvalidArgument(
              "alltoall received " + std::to_string(rows[r]) + " rows from rank " +
              std::to_string(r) + ", more than received_splits (int32) can hold");
        }
        flat(r) = static_cast<int32>(rows[r]);
      }
      return ddl::Status::Ok();
    };
    w.done = Completion(ctx, std::move(done), 1);
    ddl::Submit(std::move(works), process_set_);
  }
};

class BarrierKernel : public CollectiveKernel {
 public:
  explicit BarrierKernel(OpKernelConstruction* c)
      : CollectiveKernel(c, ddl::Collective::kBarrier) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::vector<ddl::Work> works(1);
    works[0].name = CollectiveName(ctx);
    works[0].collective = ddl::Collective::kBarrier;
    works[0].done = Completion(ctx, std::move(done), 1);
    ddl::Submit(std::move(works), process_set_);
  }
};

// Returns once every rank has joined; meanwhile this rank's engine stands in
// for the collectives the others run.
class JoinKernel : public CollectiveKernel {
 public:
  explicit JoinKernel(OpKernelConstruction* c) : CollectiveKernel(c, ddl::Collective::kJoin) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    std::vector<ddl::Work> works(1);
    works[0].name = "join";
    works[0].collective = ddl::Collective::kJoin;
    works[0].output = out->data();
    works[0].done = Completion(ctx, std::move(done), 1);
    ddl::Submit(std::move(works), process_set_);
  }
};

template <ddl::Collective C, typename K>
class Bound : public K {
 public:
  explicit Bound(OpKernelConstruction* c) : K(c, C) {}
};

REGISTER_KERNEL_BUILDER(Name("DdlAllreduce").Device(DEVICE_CPU).HostMemory("tensor_name"),
                        Bound<ddl::Collective::kAllreduce, SameShapeKernel>);
REGISTER_KERNEL_BUILDER(Name("DdlGroupedAllreduce").Device(DEVICE_CPU).HostMemory("tensor_name"),
                        Bound<ddl::Collective::kAllreduce, SameShapeKernel>);
REGISTER_KERNEL_BUILDER(Name("DdlBroadcast").Device(DEVICE_CPU).HostMemory("tensor_name"),
                        Bound<ddl::Collective::kBroadcast, SameShapeKernel>);
REGISTER_KERNEL_BUILDER(Name("DdlAllgather").Device(DEVICE_CPU).HostMemory("tensor_name"),
                        Bound<ddl::Collective::kAllgather, CoreShapedKernel>);
REGISTER_KERNEL_BUILDER(Name("DdlReducescatter").Device(DEVICE_CPU).HostMemory("tensor_name"),
                        Bound<ddl::Collective::kReducescatter, CoreShapedKernel>);
REGISTER_KERNEL_BUILDER(Name("DdlAlltoall")
                            .Device(DEVICE_CPU)
                            .HostMemory("splits")
                            .HostMemory("tensor_name")
                            .HostMemory("received_splits"),
                        Bound<ddl::Collective::kAlltoall, AlltoallKernel>);
REGISTER_KERNEL_BUILDER(Name("DdlBarrier").Device(DEVICE_CPU).HostMemory("tensor_name"),
                        BarrierKernel);
REGISTER_KERNEL_BUILDER(Name("DdlJoin").Device(DEVICE_CPU).HostMemory("last_joined"), JoinKernel);

}  // namespace
}  // namespace tensorflow
