"""The SigV4 signer reproduces AWS's published signatures byte for byte.

Vectors: the AWS SigV4 test suite (`get-vanilla`, `get-vanilla-query-order-key-case`,
`post-vanilla`; credentials AKIDEXAMPLE, 2015-08-30T12:36:00Z, service `service`) and the
examples of the S3 API reference, "Signature Calculations for the Authorization Header"
(examplebucket, 2013-05-24T00:00:00Z).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from step_persistence.media.sigv4 import EMPTY_SHA256, Credentials, canonical_request, encode_path, sign

SUITE = Credentials('AKIDEXAMPLE', 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY')
SUITE_TIME = datetime(2015, 8, 30, 12, 36, tzinfo=UTC)
S3_DOCS = Credentials('AKIAIOSFODNN7EXAMPLE', 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY')
S3_DOCS_TIME = datetime(2013, 5, 24, tzinfo=UTC)
S3_HOST = 'examplebucket.s3.amazonaws.com'
WELCOME_SHA256 = hashlib.sha256(b'Welcome to Amazon S3.').hexdigest()


@pytest.mark.parametrize(
    ('method', 'query', 'signature'),
    [
        ('GET', [], '5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31'),
        (
            'GET',
            [('Param2', 'value2'), ('Param1', 'value1')],
            'b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500',
        ),
        ('POST', [], '5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b'),
    ],
    ids=['get-vanilla', 'get-vanilla-query-order-key-case', 'post-vanilla'],
)
def test_aws_test_suite(method: str, query: list[tuple[str, str]], signature: str) -> None:
    added = sign(
        method=method,
        path='/',
        query=query,
        headers={'Host': 'example.amazonaws.com'},
        payload_sha256=EMPTY_SHA256,
        credentials=SUITE,
        region='us-east-1',
        service='service',
        now=SUITE_TIME,
    )
    assert added['x-amz-date'] == '20150830T123600Z'
    assert added['Authorization'] == (
        'AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, '
        f'SignedHeaders=host;x-amz-date, Signature={signature}'
    )


def _s3_docs_signature(
    method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str], payload: str
) -> str:
    added = sign(
        method=method,
        path=encode_path(path),
        query=query,
        headers={'Host': S3_HOST, 'x-amz-content-sha256': payload, **headers},
        payload_sha256=payload,
        credentials=S3_DOCS,
        region='us-east-1',
        now=S3_DOCS_TIME,
    )
    return added['Authorization'].rsplit('Signature=', 1)[1]


def test_s3_docs_get_object() -> None:
    signature = _s3_docs_signature('GET', '/test.txt', [], {'Range': 'bytes=0-9'}, EMPTY_SHA256)
    assert signature == 'f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41'


def test_s3_docs_get_object_canonical_request() -> None:
    """The intermediate step matches too (its hash is printed in the example's StringToSign)."""
    request, signed = canonical_request(
        'GET',
        '/test.txt',
        [],
        {
            'Host': S3_HOST,
            'Range': 'bytes=0-9',
            'x-amz-content-sha256': EMPTY_SHA256,
            'x-amz-date': '20130524T000000Z',
        },
        EMPTY_SHA256,
    )
    assert signed == 'host;range;x-amz-content-sha256;x-amz-date'
    assert hashlib.sha256(request.encode()).hexdigest() == (
        '7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972'
    )


def test_s3_docs_put_object_with_an_encoded_key() -> None:
    headers = {'Date': 'Fri, 24 May 2013 00:00:00 GMT', 'x-amz-storage-class': 'REDUCED_REDUNDANCY'}
    signature = _s3_docs_signature('PUT', '/test$file.text', [], headers, WELCOME_SHA256)
    assert signature == '98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd'


@pytest.mark.parametrize(
    ('query', 'signature'),
    [
        ([('lifecycle', '')], 'fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543'),
        ([('prefix', 'J'), ('max-keys', '2')], '34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7'),
    ],
    ids=['get-bucket-lifecycle', 'list-objects'],
)
def test_s3_docs_bucket_requests(query: list[tuple[str, str]], signature: str) -> None:
    assert _s3_docs_signature('GET', '/', query, {}, EMPTY_SHA256) == signature


def test_session_token_is_sent_and_signed() -> None:
    credentials = Credentials('AKIDEXAMPLE', 'secret', session_token='token/with+chars')
    added = sign(
        method='GET',
        path='/',
        headers={'Host': 'example.amazonaws.com'},
        payload_sha256=EMPTY_SHA256,
        credentials=credentials,
        region='us-east-1',
        now=SUITE_TIME,
    )
    assert added['x-amz-security-token'] == 'token/with+chars'
    assert 'SignedHeaders=host;x-amz-date;x-amz-security-token,' in added['Authorization']


def test_encode_path_encodes_each_byte_once() -> None:
    assert encode_path('/bucket/a b/été+$~_-.x') == '/bucket/a%20b/%C3%A9t%C3%A9%2B%24~_-.x'
