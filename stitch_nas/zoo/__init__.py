"""The zoo: named pretrained models with their input spec and label names, from timm,
torchvision, a user's own ``nn.Module`` or checkpoint, and the embedded mini zoo.
"""

from ._architectures import (
    ARCHITECTURE_SOURCES,
    check_architecture,
    create_architecture,
)
from ._checkpoints import (
    load_state_dict_file,
)
from ._entry import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    InputSpec,
    Zoo,
    ZooEntry,
)
from ._mini import (
    MINI_ZOO_NAMES,
    architecture_of,
    build_model,
    default_cache_dir,
    load_mini_zoo,
)
from ._sources import (
    from_module,
    from_timm,
    from_torchvision,
)
from ._yaml import (
    import_factory,
    module_entry,
    timm_entry,
    torchvision_entry,
    user_code_modules,
)

__all__ = [
    "ARCHITECTURE_SOURCES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "InputSpec",
    "MINI_ZOO_NAMES",
    "Zoo",
    "ZooEntry",
    "architecture_of",
    "build_model",
    "check_architecture",
    "create_architecture",
    "default_cache_dir",
    "from_module",
    "from_timm",
    "from_torchvision",
    "import_factory",
    "load_mini_zoo",
    "load_state_dict_file",
    "module_entry",
    "timm_entry",
    "torchvision_entry",
    "user_code_modules",
]
