// Models from checkpoints (see model_source.hpp).
#include "launch/model_source.hpp"

#include "launch/device.hpp"
#include "launch/trainer.hpp"

namespace ringtrain::launch {

LoadedModel load_model_from_checkpoint(const std::string& checkpoint, DType precision,
                                       Device device, kernels::Backend& backend) {
  LoadedModel out;
  out.meta = io::read_checkpoint_meta(checkpoint);
  const ModelSpec spec = ModelSpec::from_json(out.meta.model);
  {
    DeviceScope on_device(device);
    out.model = build_model(spec, precision);
  }
  if (device.kind == Device::cpu) {
    io::read_checkpoint_params(checkpoint, master_views(*out.model));
    io::read_checkpoint_buffers(checkpoint, buffer_views(*out.model));
  } else {  // read into host copies, then upload
    HostMirror host(*out.model, nullptr);
    io::read_checkpoint_params(checkpoint, host.params);
    io::read_checkpoint_buffers(checkpoint, host.buffers);
    host.upload();
  }
  out.model->refresh_working_copy(backend);
  return out;
}

void require_data_fits(const Model& model, const io::DatasetInfo& data,
                       const std::string& checkpoint) {
  const ModelSpec& spec = model.spec();
  RT_REQUIRE(spec.input == data.sample_shape, "--data '", data.path, "' has samples of shape ",
             shape_str(data.sample_shape), " but checkpoint '", checkpoint, "' holds a model for ",
             shape_str(spec.input));
  RT_REQUIRE(data.num_classes <= spec.classes, "--data '", data.path, "' has ", data.num_classes,
             " classes but the model of checkpoint '", checkpoint, "' predicts ", spec.classes);
}

int64_t model_classes(const Model& model) { return model.spec().classes; }

}  // namespace ringtrain::launch
