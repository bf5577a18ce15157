"""Finding a model and reading what its files say: config.json, a model folder, the local Hugging
Face cache, the built-in presets. The one package of the core that reads files and the environment.
"""
