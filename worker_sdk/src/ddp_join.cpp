// Python's _DDPJoinHook (torch/nn/parallel/distributed.py): what a rank that has run out of
// inputs does for DDP while the others train, and the final model sync (see join.hpp).
#include "ddp_impl.hpp"

namespace ddprun::worker::detail {

namespace {

// Python's _DDPJoinHook: a joined rank's shadow of one DDP iteration, and the final model sync.
class DdpJoinHook final : public JoinHook {
 public:
  DdpJoinHook(std::shared_ptr<DdpCore::Impl> ddp, bool divide_by_initial_world_size) : ddp_(std::move(ddp)) {
    ddp_->logger->set_uneven_input_join();
    ddp_->divide_by_initial_world_size = divide_by_initial_world_size;
  }

  void main_hook() override {
    DdpCore::Impl& s = *ddp_;
    try {
      s.reducer->rebuild_buckets();  // once per training, as the others' forward does
      // The others' buffer broadcast, from the largest rank still training.
      if (s.will_sync_module_buffers()) s.sync_module_buffers(s.find_common_rank(false));
      bool sync_backward = false;
      {
        auto t = torch::zeros({1}, torch::TensorOptions().device(s.device()));
        std::vector<at::Tensor> tensors{t};
        CollectiveWait waiting;
        s.pg->allreduce(tensors)->wait();
        sync_backward = t.item<double>() != 0;
      }
      // No gradient sync this iteration means no buffer broadcast in the next one.
      s.require_forward_param_sync = sync_backward;
      if (!sync_backward) return;
      // One all-reduce of zeros per bucket, in the reducer's order, through the communication hook
      // if one is registered (the divide factor then counts the ranks still training, or not).
      std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
      for (auto& bucket : s.reducer->get_grad_buckets(/*return_zero_tensors=*/true)) {
        futures.push_back(s.reducer->run_comm_hook(bucket));
      }
      {
        CollectiveWait waiting;
#ifdef DDPRUN_WORKER_DIRECT_GLOO
        if (s.comm) s.comm->drain();
#endif
        for (auto& f : futures) {
          f->wait();
          if (f->hasError()) std::rethrow_exception(f->exception_ptr());
        }
      }
      if (s.options.find_unused_parameters()) {  // the others' map of used parameters
        std::vector<at::Tensor> tensors{s.reducer->get_local_used_map_on_device()};
        CollectiveWait waiting;
        s.pg->allreduce(tensors)->wait();
      }
      s.reducer->push_rebuilt_params_for_all_indices();
    } catch (const c10::Error& e) {
      rethrow_clean(e);
    }
  }

  // _sync_final_model: every rank takes the model of the largest of the last ranks to join.
  void post_hook(bool is_last_joiner) override {
    DdpCore::Impl& s = *ddp_;
    try {
      const int src = s.find_common_rank(is_last_joiner);
      s.broadcast_from(s.module_states(s.states_with_buffers()), src);
    } catch (const c10::Error& e) {
      rethrow_clean(e);
    }
  }

 private:
  std::shared_ptr<DdpCore::Impl> ddp_;
};

}  // namespace

std::unique_ptr<JoinHook> DdpCore::join_hook(const JoinOptions& options) {
  return std::make_unique<DdpJoinHook>(impl_, options.divide_by_initial_world_size());
}

torch::Device DdpCore::device() const { return impl_->device(); }

}  // namespace ddprun::worker::detail
