"""Installs the `hubvit` package: hubvit/ (the command line, training, analysis, the folder layer) with the user's
top-level modeling/, conversion/ and model_cards/ mapped into it.

`pip install hubvit` is enough to load and convert checkpoints; fine-tuning, publishing and plotting are extras
(`.[train]`, `.[publish]`, `.[plot]`), and `.[test]` pulls everything the test suite and the linter run.
"""

from setuptools import setup

ONNX = ["onnx", "onnxscript", "onnxruntime", "openvino"]
PLOT = ["matplotlib"]
PUBLISH = ["pyyaml"]
TRAIN = ["accelerate", "datasets", "evaluate", "mlxtend>=0.23", "tensorboard", "torchdata>=0.8", *PLOT]
BENCHMARK = ["timm>=1.0.20", *ONNX]
JAX = ["jax>=0.4.30", "jaxlib>=0.4.30", "flax>=0.10", "scipy"]
TEST = [
    "pytest>=9",
    "pytest-xdist>=3.6",
    "ruff>=0.6",
    "timm>=1.0.20",
    "open-clip-torch>=3",  # open_clip checkpoints are converted, and checked against open_clip itself
    *JAX,
    "scikit-learn",
    "scikit-image",
    "grad-cam",
    "peft",
    "parameterized",
    *ONNX,
    *TRAIN,
    *PUBLISH,
]

setup(
    name="hubvit",
    version="0.1.0",
    description="A Vision Transformer for transformers, exact to the original weights, that lives on the Hub",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=[
        "hubvit",
        "hubvit.cli",
        "hubvit.analysis",
        "hubvit.training",
        "hubvit.modeling",
        "hubvit.conversion",
        "hubvit.model_cards",
    ],
    # The user's top-level folders that ship inside the package; everything else it ships lives under hubvit/.
    # scripts/ (the experiments, doc renderers, thin entry scripts) and benchmarks/ run from a checkout only.
    package_dir={
        "hubvit.modeling": "modeling",
        "hubvit.conversion": "conversion",
        "hubvit.model_cards": "model_cards",
    },
    package_data={"hubvit.model_cards": ["*.md"], "hubvit.training": ["metrics/*/*.py"]},
    install_requires=[
        "transformers>=5.24",
        "torch",
        "torchvision",
        "huggingface_hub",
        "safetensors",
        "pillow",
        "numpy",
    ],
    extras_require={
        "train": TRAIN,
        "publish": PUBLISH,
        "plot": PLOT,
        "timm": ["timm>=1.0.20"],
        "onnx": ONNX,
        "benchmark": BENCHMARK,
        "jax": JAX,
        "test": TEST,
    },
    entry_points={"console_scripts": ["hubvit=hubvit.cli:main"]},
)
