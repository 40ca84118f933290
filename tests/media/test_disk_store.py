"""What is particular to `DiskMediaStore`: the files it writes and how it reads what it finds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from step_persistence.media import DiskMediaStore, MediaContext, media_uri_for

pytestmark = pytest.mark.anyio


def files_under(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob('*') if path.is_file())


async def test_one_file_per_blob_and_a_sidecar_with_its_context(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    context = MediaContext(media_type='image/png', filename='a.png', metadata={'k': 'v'})
    uri = await store.put(b'blob', context=context)
    await store.put(b'blob', context=context)
    digest = uri[-64:]
    assert files_under(tmp_path) == [f'{digest}.bin', f'{digest}.bin.meta.json']
    assert (tmp_path / f'{digest}.bin').read_bytes() == b'blob'
    assert json.loads((tmp_path / f'{digest}.bin.meta.json').read_text()) == {
        'v': 1,
        'uri': uri,
        'media_type': 'image/png',
        'filename': 'a.png',
        'metadata': {'k': 'v'},
    }


async def test_nested_keys_create_directories(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path, key_strategy=lambda uri, context: f'{uri[15:17]}/{uri[17:19]}/{uri[15:]}')
    uri = await store.put(b'nested')
    digest = uri[-64:]
    assert (tmp_path / digest[:2] / digest[2:4] / digest).read_bytes() == b'nested'
    assert await store.get(uri) == b'nested'


async def test_a_blob_without_sidecar_has_empty_metadata(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = media_uri_for(b'copied in by hand')
    store.path_for(uri).write_bytes(b'copied in by hand')
    assert await store.get(uri) == b'copied in by hand'
    assert dict(await store.get_metadata(uri)) == {}


async def test_a_sidecar_without_its_blob_is_rewritten_by_the_next_put(tmp_path: Path) -> None:
    """A crash between the two writes leaves only the sidecar: the blob does not exist yet."""
    store = DiskMediaStore(tmp_path)
    uri = media_uri_for(b'interrupted')
    sidecar = tmp_path / f'{uri[-64:]}.bin.meta.json'
    sidecar.write_text('{"half": "written"')
    assert await store.exists(uri) is False
    await store.put(b'interrupted', context=MediaContext(metadata={'complete': 'yes'}))
    assert dict(await store.get_metadata(uri)) == {'complete': 'yes'}


async def test_a_corrupt_sidecar_is_a_value_error(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'data')
    (tmp_path / f'{uri[-64:]}.bin.meta.json').write_text('{"metadata": {"k": 1}}')
    with pytest.raises(ValueError, match='sidecar'):
        await store.get_metadata(uri)


async def test_keys_that_would_clash_with_sidecars_are_rejected(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path, key_strategy=lambda uri, context: f'{uri[15:]}.meta.json')
    with pytest.raises(ValueError, match='reserved'):
        await store.put(b'data')
    assert files_under(tmp_path) == []
