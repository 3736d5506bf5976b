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
    # Loose ranges of what the code needs; requirements/constraints.txt pins the tested set.
    install_requires=[
        'torch>=2.1',
        'torchvision>=0.16',
        'mmengine>=0.10,<0.11',
        'timm>=0.9',
        'numpy>=1.24',
        'scikit-learn>=1.3',
        'pillow>=9',
        'tensorboard>=2.12',
        'matplotlib>=3.7',
        'pycocotools>=2.0.6',
        'faiss-cpu>=1.7.4; platform_system != "Windows"',
        'pyyaml>=5.4',
        'tqdm>=4.60',
        'huggingface_hub>=1.0',  # the zoo's hf:// sources and tools/publish_model.py --push-to-hub
    ],
    entry_points={'console_scripts': ['ifnd-zoo=ifnd.zoo:main']},
    extras_require={
        # faiss on the GPU: install instead of faiss-cpu (pip uninstall faiss-cpu first).
        'faiss-gpu': ['faiss-gpu>=1.7.4'],
        # Views made on the training device (augment_on='device' in the dataset configs): TorchCodec
        # decodes their image files (JPEG on the device); without it, torchvision's decoders do.
        'device': [TORCHCODEC],
        'torchcodec': [TORCHCODEC],
        'tests': ['pytest>=7', TORCHCODEC],  # both decoders are tested where TorchCodec decodes
    },
)
