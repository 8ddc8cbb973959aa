"""Installs the `hubvit` namespace onto the repository's top-level folders (modeling/, conversion/, scripts/)."""

from setuptools import setup

ONNX = ["onnx", "onnxscript", "onnxruntime"]
BENCHMARK = ["timm>=1.0.20", "openvino>=2024.0", *ONNX]
TEST = [
    "pytest>=8",
    "timm>=1.0.20",
    "jax>=0.4.30",
    "jaxlib>=0.4.30",
    "flax>=0.10",
    "scipy",
    "scikit-learn",
    "scikit-image",
    "tensorboard",
    "grad-cam",
    "peft",
    "parameterized",
    *ONNX,
]

setup(
    name="hubvit",
    version="0.1.0",
    description="A Vision Transformer for transformers, exact to the original weights, that lives on the Hub",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=[
        "hubvit",
        "hubvit.modeling",
        "hubvit.conversion",
        "hubvit.scripts",
        "hubvit.scripts.experiments",
        "hubvit.model_cards",
        "hubvit.analysis",
    ],
    package_dir={
        "hubvit": "hubvit",
        "hubvit.model_cards": "model_cards",
        "hubvit.modeling": "modeling",
        "hubvit.conversion": "conversion",
        "hubvit.scripts": "scripts",
        "hubvit.analysis": "analysis",
    },
    package_data={"hubvit.model_cards": ["*.md"], "hubvit.scripts": ["metrics/*/*.py"]},
    install_requires=[
        "transformers>=5",
        "torch",
        "torchvision",
        "accelerate",
        "datasets",
        "evaluate",
        "huggingface_hub",
        "safetensors",
        "mlxtend>=0.23",
        "pillow",
        "numpy",
        "matplotlib",
        "pyyaml",
    ],
    extras_require={
        "test": TEST,
        "timm": ["timm>=1.0.20"],
        "onnx": ONNX,
        "benchmark": BENCHMARK,
        "jax": ["jax>=0.4.30", "jaxlib>=0.4.30", "flax>=0.10", "scipy"],
    },
    entry_points={"console_scripts": ["hubvit=hubvit.scripts.cli:main"]},
)
