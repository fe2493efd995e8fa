"""Optional signing of exports: an HMAC-SHA256 over ``meta.json`` with a key from the environment.

The sha256 checksums in ``meta.json`` catch accidents (a truncated copy, a flipped bit), not a
consistent edit: whoever changes a file can write its new sha256 into ``meta.json`` too. With a
key in ``STITCH_NAS_EXPORT_KEY``, an export also writes ``signature.json``, an HMAC-SHA256 of
``meta.json``'s exact bytes; since ``meta.json`` holds the sha256 of every other file, the
signature covers the whole folder, and nobody without the key can re-sign an edited one.
:func:`check_signature` is what ``stitch_nas.load`` runs: with the key set it refuses an
unsigned or wrongly signed folder, without it nothing changes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from pathlib import Path

from stitch_nas.errors import IntegrityError
from stitch_nas.files import atomic_write

__all__ = ["KEY_VARIABLE", "SIGNATURE_FILE", "check_signature", "export_key", "sign_folder"]

logger = logging.getLogger(__name__)

KEY_VARIABLE = "STITCH_NAS_EXPORT_KEY"
SIGNATURE_FILE = "signature.json"
_ALGORITHM = "hmac-sha256"
# the signed message starts with a label, so a MAC made with the same key for another purpose
# can never pass as an export's signature
_LABEL = b"stitch_nas export meta.json v1\n"


def export_key() -> bytes | None:
    """The signing key from ``STITCH_NAS_EXPORT_KEY``, or None when it is unset or empty."""
    key = os.environ.get(KEY_VARIABLE, "")
    return key.encode() if key else None


def _key_id(key: bytes) -> str:
    # names the key in errors ("signed with another key") without revealing it
    return hashlib.sha256(b"stitch_nas key id\n" + key).hexdigest()[:12]


def _mac(key: bytes, meta: bytes) -> str:
    return hmac.new(key, _LABEL + meta, hashlib.sha256).hexdigest()


def sign_folder(folder: Path) -> bool:
    """Write ``signature.json`` for ``folder/meta.json`` when a key is set; True if signed."""
    key = export_key()
    if key is None:
        return False
    meta = (folder / "meta.json").read_bytes()
    signature = {"algorithm": _ALGORITHM, "key_id": _key_id(key), "hmac": _mac(key, meta)}
    atomic_write(folder / SIGNATURE_FILE, json.dumps(signature, indent=1).encode())
    return True


def check_signature(folder: Path, require_signature: bool | None) -> bool:
    """Verify ``folder``'s signature against ``meta.json``; True when it was verified.

    Args:
        require_signature: None (the default of ``load``): required exactly when the key is
            set. True: refuse an unsigned folder, and any folder when no key is set. False:
            accept an unsigned folder even with the key set (a signature present is still
            checked).

    Raises:
        IntegrityError: a signature that does not match (an edited folder, or another key),
            or a missing one where it is required.
    """
    key = export_key()
    path = folder / SIGNATURE_FILE
    if key is None:
        if require_signature:
            raise IntegrityError(
                f"{folder} must be signed (require_signature=True) but {KEY_VARIABLE} is not "
                "set; set it to the key the export was signed with"
            )
        if path.exists():
            logger.info("%s is signed; set %s to verify it", folder, KEY_VARIABLE)
        return False
    if not path.is_file():
        if require_signature is False:
            logger.warning("%s is not signed; loaded unverified (require_signature=False)", folder)
            return False
        raise IntegrityError(
            f"{folder} is not signed and {KEY_VARIABLE} is set; export it again with the key, "
            "or pass require_signature=False to load it unverified"
        )
    try:
        signature = json.loads(path.read_text())
        algorithm, key_id, mac = signature["algorithm"], signature["key_id"], signature["hmac"]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise IntegrityError(f"{str(path)!r} is unreadable ({exc!r}); refusing to load") from exc
    if algorithm != _ALGORITHM or not isinstance(mac, str) or not mac.isascii():
        raise IntegrityError(f"{str(path)!r} is not an {_ALGORITHM} signature; refusing to load")
    if key_id != _key_id(key):
        raise IntegrityError(
            f"{folder} was signed with another key (id {key_id}) than {KEY_VARIABLE} "
            f"(id {_key_id(key)}); refusing to load it"
        )
    expected = _mac(key, (folder / "meta.json").read_bytes())
    if not hmac.compare_digest(expected, mac):
        raise IntegrityError(
            f"{folder}/meta.json does not match its signature (edited since export); "
            "refusing to load it; export the network again"
        )
    return True
