"""What a user of one transformers release does with hubvit folders, as a script: `python compatibility_child.py
REQUEST.json` (keys: folders {name: path}, inputs, image, out {name: path}, release_path or null for the running
environment's release).

hubvit is hidden before anything is imported, so only the code copied into the folders can run. Every output the
compatibility test compares is written to `out[name]` (safetensors); one JSON line on stdout says what else was seen
per folder: where the model class came from, what it made of the config (`config_facts`), the warnings the
folders' code raised, the pipeline's answer; and, once, what the release's own `ConfigTester.run_common_tests()`
(from its source distribution, tests/transformers_sources.py) made of the folders' config class.
`outputs()` is also what the test runs in its own process on the installed hubvit, so both sides do the same.
"""

import json
import sys
import warnings

SELECTION = [0, -1]
# Values of the wrong type for four fields: every release must refuse them with the same message.
WRONG_TYPES = {"hidden_size": "768", "qkv_bias": "yes", "layer_norm_eps": True, "representation_size": 1.5}


def config_facts(config_class, folder):
    """What a release makes of a folder's config: every declared field's value (as `to_dict` writes it: the
    public names `out_features` / `out_indices` for `_out_features` / `_out_indices`), the stages after
    `from_pretrained(folder, num_hidden_layers=1)`, and the message each of `WRONG_TYPES` is refused with."""
    config = config_class.from_pretrained(folder)
    written = config.to_dict()
    fields = {name.lstrip("_"): written[name.lstrip("_")] for name in config_class.__annotations__}
    shallow = config_class.from_pretrained(folder, num_hidden_layers=1)
    refused = {}
    for name, value in WRONG_TYPES.items():
        try:
            config_class(**{name: value})
            refused[name] = None
        except ValueError as error:
            refused[name] = str(error)
    return dict(fields=fields, shallow_stages=[shallow.out_features, shallow.out_indices], refused=refused)


def outputs(classifier_cls, body_cls, folder, x, **load):
    """{name: tensor} for eager and sdpa: logits (as object and tuple), hidden states and attentions, hidden states
    selected by index, the body's last hidden state and pooled vector; plus the selection's None pattern."""
    import torch

    tensors, absent = {}, {}
    for attention in ("sdpa", "eager"):
        classifier = classifier_cls.from_pretrained(folder, attn_implementation=attention, **load).eval()
        body = body_cls.from_pretrained(folder, attn_implementation=attention, **load).eval()
        with torch.no_grad():
            tensors[f"{attention}.logits"] = classifier(x).logits
            tensors[f"{attention}.tuple_logits"] = classifier(x, return_dict=False)[0]
            full = classifier(x, output_hidden_states=True, output_attentions=True)
            for key in ("hidden_states", "attentions"):
                for index, tensor in enumerate(getattr(full, key)):
                    tensors[f"{attention}.{key}.{index}"] = tensor
            selected = classifier(x, output_hidden_states=SELECTION).hidden_states
            absent[attention] = [tensor is None for tensor in selected]
            for index, tensor in enumerate(selected):
                if tensor is not None:
                    tensors[f"{attention}.selected.{index}"] = tensor
            features = body(x)
            tensors[f"{attention}.last_hidden_state"] = features.last_hidden_state
            tensors[f"{attention}.pooler_output"] = features.pooler_output
    return {name: tensor.contiguous() for name, tensor in tensors.items()}, absent


def main(path):
    with open(path) as handle:
        request = json.load(handle)
    sys.modules["hubvit"] = None
    if request.get("release_path"):
        sys.path.insert(0, request["release_path"])
        # An optional integration of transformers itself, not of hubvit: transformers 5.0-5.10 fail at import with
        # the `kernels` releases newer than they know (0.19: "Either a revision or a version must be specified"),
        # whatever model is loaded. Hidden, as on a machine without it.
        sys.modules["kernels"] = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
        import transformers
        from safetensors.torch import load_file, save_file
        from transformers import AutoConfig, AutoModel, AutoModelForImageClassification, pipeline

        x = load_file(request["inputs"])["pixel_values"]
        seen = {}
        for name, folder in request["folders"].items():
            config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
            _, info = AutoModelForImageClassification.from_pretrained(
                folder, trust_remote_code=True, output_loading_info=True
            )
            tensors, absent = outputs(AutoModelForImageClassification, AutoModel, folder, x, trust_remote_code=True)
            save_file(tensors, request["out"][name])
            classify = pipeline("image-classification", model=folder, trust_remote_code=True)
            needs_processor = classify.image_processor is None
            if needs_processor:  # 4.46 loads image processors for the model types it knows only
                classify = pipeline(
                    "image-classification", model=folder, image_processor=folder, trust_remote_code=True
                )
            seen[name] = dict(
                config_class=type(config).__module__,
                config=config_facts(type(config), folder),
                loading_info={key: sorted(map(str, value)) for key, value in info.items()},
                absent=absent,
                pipeline=classify(request["image"]),
                pipeline_needs_image_processor=needs_processor,
            )
    from transformers_sources import run_config_tester  # the release's own ConfigTester, outside the warnings caught

    config_tester = run_config_tester(type(config))
    print(
        json.dumps(
            dict(
                config_tester=config_tester,
                transformers=transformers.__version__,
                transformers_path=transformers.__file__,
                torch=torch.__version__,
                python=".".join(map(str, sys.version_info[:3])),
                warnings=[str(w.message) for w in caught if "HubViT" in str(w.message)],
                folders=seen,
            )
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
