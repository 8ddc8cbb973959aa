"""transformers' own common model and config tests (ModelTesterMixin, ConfigTester of the installed release) against
HubViTModel and HubViTForImageClassification, as transformers runs them on its ViT; plus transformers' image
pipelines on a saved hubvit folder.

The common test modules come from the installed version's source distribution (tests/transformers_sources.py). Every
skip below names why the test does not apply to a ViT.
"""

import unittest

import numpy as np
import pytest
import torch
from torch import nn
from transformers.models.auto import modeling_auto

from hubvit import HubViTConfig, HubViTForImageClassification, HubViTModel
from transformers_sources import import_common_tests

test_modeling_common, test_configuration_common = import_common_tests()
ModelTesterMixin = test_modeling_common.ModelTesterMixin
floats_tensor, ids_tensor = test_modeling_common.floats_tensor, test_modeling_common.ids_tensor
ConfigTester = test_configuration_common.ConfigTester

# The common tests tell base models from heads by class name, through transformers' own name tables; a model
# registered with the Auto classes is not listed there, so the tests list hubvit as transformers lists its ViT.
NAME_TABLES = (
    (modeling_auto.MODEL_MAPPING_NAMES, "HubViTModel"),
    (modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES, "HubViTForImageClassification"),
)


class HubViTModelTester:
    """transformers' ViT tester's model (2 layers, 32 wide, 4 heads, 2x2 patches) on 16x16 images instead of 30x30
    (64 patches + [CLS] instead of 225 + 1), which keeps the ~165 common tests to minutes on 2 cores."""

    def __init__(
        self,
        parent,
        batch_size=13,
        image_size=16,
        patch_size=2,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=10,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.num_labels = num_labels
        self.is_training = True
        self.seq_length = (image_size // patch_size) ** 2 + 1

    def get_config(self):
        return HubViTConfig(
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            num_labels=self.num_labels,
            initializer_range=0.02,
        )

    def prepare_config_and_inputs(self):
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        labels = ids_tensor([self.batch_size], self.num_labels)
        return self.get_config(), pixel_values, labels

    def prepare_config_and_inputs_for_common(self):
        config, pixel_values, _ = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}

    def create_and_check_model(self, config, pixel_values, labels):
        model = HubViTModel(config).eval()
        result = model(pixel_values)
        self.parent.assertEqual(result.last_hidden_state.shape, (self.batch_size, self.seq_length, self.hidden_size))
        self.parent.assertEqual(result.pooler_output.shape, (self.batch_size, self.hidden_size))

    def create_and_check_for_image_classification(self, config, pixel_values, labels):
        model = HubViTForImageClassification(config).eval()
        result = model(pixel_values, labels=labels)
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_labels))
        self.parent.assertEqual(result.loss.shape, ())
        config.num_channels = 1  # greyscale
        model = HubViTForImageClassification(config).eval()
        result = model(floats_tensor([self.batch_size, 1, self.image_size, self.image_size]))
        self.parent.assertEqual(result.logits.shape, (self.batch_size, self.num_labels))


@pytest.mark.heavy
class HubViTModelTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (HubViTModel, HubViTForImageClassification)
    test_resize_embeddings = False  # no token embedding table: the "vocabulary" is the patch projection
    test_resize_position_embeddings = False
    # transformers skips this for models whose files carry no copyright year from 2023 on; hubvit's _init_weights
    # is meant to cover every weight, so the check runs.
    test_can_init_all_missing_weights_before_2023 = True
    has_attentions = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.listed = [(table, name) for table, name in NAME_TABLES if "hubvit" not in table]
        for table, name in cls.listed:
            table["hubvit"] = name

    @classmethod
    def tearDownClass(cls):
        for table, _ in cls.listed:
            del table["hubvit"]
        super().tearDownClass()

    def setUp(self):
        self.model_tester = HubViTModelTester(self)
        # hubvit checks hidden_size against num_attention_heads when the config is built (transformers' ViT test
        # passes hidden_size=37 alone, which HubViTConfig refuses), so the odd width comes with a head count.
        self.config_tester = ConfigTester(
            self, config_class=HubViTConfig, has_text_modality=False, hidden_size=36, num_attention_heads=6
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model(self):
        self.model_tester.create_and_check_model(*self.model_tester.prepare_config_and_inputs())

    def test_for_image_classification(self):
        self.model_tester.create_and_check_for_image_classification(*self.model_tester.prepare_config_and_inputs())

    def test_model_get_set_embeddings(self):
        """A ViT's input embedding is the patch projection (a module, not a token table); it has no output
        embedding to tie."""
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), nn.Module)
            self.assertTrue(
                model.get_output_embeddings() is None or isinstance(model.get_output_embeddings(), nn.Linear)
            )

    @unittest.skip(reason="a ViT takes pixel_values only: there are no input ids, so no inputs_embeds")
    def test_inputs_embeds(self):
        pass

    @unittest.skip(
        reason="checks SDPA dispatch across the sub-configs of composite models; a ViT has one config, and "
        "test_sdpa_can_dispatch_non_composite_models runs (transformers' own skip says 'does not support SDPA')"
    )
    def test_sdpa_can_dispatch_composite_models(self):
        pass

    @unittest.skip(reason="a ViT has no token embedding table to resize: its input embedding is the patch projection")
    def test_resize_tokens_embeddings(self):
        pass

    @unittest.skip(reason="a ViT has no token embedding table to resize: its input embedding is the patch projection")
    def test_resize_embeddings_untied(self):
        pass

    @unittest.skip(reason="a ViT has no token embedding table to resize: its input embedding is the patch projection")
    def test_resize_embeddings_untied_no_reinit_on_post_init(self):
        pass

    @unittest.skip(
        reason="the test grows config.max_position_embeddings, a text-model field; a ViT's position table "
        "follows the image grid (resize_position_embeddings(image_size), tested in test_modeling.py)"
    )
    def test_resize_position_vector_embeddings(self):
        pass

    @unittest.skip(reason="a ViT takes pixel_values only: there are no input ids, so no inputs_embeds")
    def test_inputs_embeds_matches_input_ids(self):
        pass


# --- pipelines ----------------------------------------------------------------------------------------------------
# transformers' PipelineTesterMixin cannot run offline: it loads tiny models from the Hub (hf-internal-testing),
# reads tests/utils/tiny_model_summary.json at import and calls tests/pipelines/*, none of which the sdist ships.
# These tests run the two pipelines a ViT serves on a saved hubvit folder and check them against the model.


@pytest.fixture(scope="module")
def saved_classifier(tmp_path_factory):
    from transformers import ViTImageProcessor

    torch.manual_seed(0)
    config = HubViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
        id2label={0: "red", 1: "green", 2: "blue"},
        label2id={"red": 0, "green": 1, "blue": 2},
    )
    model = HubViTForImageClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.normal_()  # the paper's zero-initialised head would give three equal scores
    folder = tmp_path_factory.mktemp("pipeline") / "model"
    model.save_pretrained(folder)
    processor = ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor.save_pretrained(folder)
    return folder, model, processor


def photographs():
    from PIL import Image
    from skimage import data

    return [Image.fromarray(data.astronaut()), Image.fromarray(data.chelsea()), Image.fromarray(data.coffee())]


def test_image_classification_pipeline_scores_the_model_logits(saved_classifier):
    """Scores are the softmax of the model's logits on the processor's pixels (float32, 1e-6 absolute)."""
    from transformers import pipeline

    folder, model, processor = saved_classifier
    classify = pipeline("image-classification", model=str(folder), device="cpu")
    images = photographs()
    results = classify(images, top_k=3, batch_size=2)
    with torch.no_grad():
        probabilities = model(**processor(images, return_tensors="pt")).logits.softmax(-1)
    assert len(results) == len(images)
    for result, expected in zip(results, probabilities):
        assert [r["label"] for r in result] == [
            model.config.id2label[i] for i in expected.argsort(descending=True).tolist()
        ]
        np.testing.assert_allclose([r["score"] for r in result], expected.sort(descending=True).values, atol=1e-6)


def test_image_feature_extraction_pipeline_returns_the_hidden_states(saved_classifier):
    """Without pooling: last_hidden_state of HubViTModel, (1, tokens, width); with pool=True: pooler_output."""
    from transformers import pipeline

    folder, model, processor = saved_classifier
    extract = pipeline("image-feature-extraction", model=str(folder), device="cpu")
    assert type(extract.model).__name__ == "HubViTModel"
    image = photographs()[1]
    with torch.no_grad():
        expected = model.hubvit(**processor(image, return_tensors="pt"))
    features = torch.tensor(extract(image))
    assert features.shape == (1, 17, 32)
    torch.testing.assert_close(features, expected.last_hidden_state, rtol=0, atol=1e-5)
    pooled = torch.tensor(extract(image, pool=True))
    torch.testing.assert_close(pooled, expected.pooler_output, rtol=0, atol=1e-5)
