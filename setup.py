from setuptools import find_packages, setup

# The device views' image decoders (torchvision's are deprecated): 0.16 brought them, for torch >= 2.11.
TORCHCODEC = 'torchcodec>=0.16'

with open('README.md', encoding='utf-8') as f:
    long_description = f.read()

setup(
    name='ifnd',
    version='0.1.0',
    description='Self-supervised contrastive learning with Incremental False Negative Detection',
    long_description=long_description,
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    packages=find_packages(include=['ifnd', 'ifnd.*']),
    python_requires='>=3.10',
    # Lower bounds: the oldest versions tested, the GPU machines' stack (Python 3.12, torch 2.11,
    # torchvision 0.26: docs/speed.md says what ran on it) and requirements/constraints.txt's set.
    install_requires=[
        'torch>=2.11',
        'torchvision>=0.26',
        'mmengine>=0.10.7,<0.11',
        'timm>=1.0.31',
        'numpy>=2.4',
        'scikit-learn>=1.9',
        'pillow>=13',
        'tensorboard>=2.21',
        'matplotlib>=3.10',
        'pycocotools>=2.0.11',
        'faiss-cpu>=1.15; platform_system != "Windows"',
        'pyyaml>=6.0',
        'tqdm>=4.70',
        'huggingface_hub>=2.4',  # the zoo's hf:// sources and tools/publish_model.py --push-to-hub
    ],
    entry_points={'console_scripts': ['ifnd-zoo=ifnd.zoo:main']},
    extras_require={
        # faiss on the GPU: install instead of faiss-cpu (pip uninstall faiss-cpu first).
        'faiss-gpu': ['faiss-gpu>=1.7.4'],
        # Views made on the training device (augment_on='device' in the dataset configs): TorchCodec
        # decodes their image files (JPEG on the device); without it, torchvision's decoders do.
        'device': [TORCHCODEC],
        'torchcodec': [TORCHCODEC],
        # Both decoders are tested where TorchCodec decodes; pytest-xdist runs the files on every core.
        'tests': ['pytest>=7', 'pytest-xdist>=3', TORCHCODEC],
    },
)
