from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FullTypeId(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TFT_UNSET: _ClassVar[FullTypeId]
    TFT_VAR: _ClassVar[FullTypeId]
    TFT_ANY: _ClassVar[FullTypeId]
    TFT_PRODUCT: _ClassVar[FullTypeId]
    TFT_NAMED: _ClassVar[FullTypeId]
    TFT_FOR_EACH: _ClassVar[FullTypeId]
    TFT_CALLABLE: _ClassVar[FullTypeId]
    TFT_TENSOR: _ClassVar[FullTypeId]
    TFT_ARRAY: _ClassVar[FullTypeId]
    TFT_OPTIONAL: _ClassVar[FullTypeId]
    TFT_LITERAL: _ClassVar[FullTypeId]
    TFT_ENCODED: _ClassVar[FullTypeId]
    TFT_SHAPE_TENSOR: _ClassVar[FullTypeId]
    TFT_BOOL: _ClassVar[FullTypeId]
    TFT_UINT8: _ClassVar[FullTypeId]
    TFT_UINT16: _ClassVar[FullTypeId]
    TFT_UINT32: _ClassVar[FullTypeId]
    TFT_UINT64: _ClassVar[FullTypeId]
    TFT_INT8: _ClassVar[FullTypeId]
    TFT_INT16: _ClassVar[FullTypeId]
    TFT_INT32: _ClassVar[FullTypeId]
    TFT_INT64: _ClassVar[FullTypeId]
    TFT_HALF: _ClassVar[FullTypeId]
    TFT_FLOAT: _ClassVar[FullTypeId]
    TFT_DOUBLE: _ClassVar[FullTypeId]
    TFT_BFLOAT16: _ClassVar[FullTypeId]
    TFT_COMPLEX64: _ClassVar[FullTypeId]
    TFT_COMPLEX128: _ClassVar[FullTypeId]
    TFT_STRING: _ClassVar[FullTypeId]
    TFT_DATASET: _ClassVar[FullTypeId]
    TFT_RAGGED: _ClassVar[FullTypeId]
    TFT_ITERATOR: _ClassVar[FullTypeId]
    TFT_MUTEX_LOCK: _ClassVar[FullTypeId]
    TFT_LEGACY_VARIANT: _ClassVar[FullTypeId]

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DT_INVALID: _ClassVar[DataType]
    DT_FLOAT: _ClassVar[DataType]
    DT_DOUBLE: _ClassVar[DataType]
    DT_INT32: _ClassVar[DataType]
    DT_UINT8: _ClassVar[DataType]
    DT_INT16: _ClassVar[DataType]
    DT_INT8: _ClassVar[DataType]
    DT_STRING: _ClassVar[DataType]
    DT_COMPLEX64: _ClassVar[DataType]
    DT_INT64: _ClassVar[DataType]
    DT_BOOL: _ClassVar[DataType]
    DT_QINT8: _ClassVar[DataType]
    DT_QUINT8: _ClassVar[DataType]
    DT_QINT32: _ClassVar[DataType]
    DT_BFLOAT16: _ClassVar[DataType]
    DT_QINT16: _ClassVar[DataType]
    DT_QUINT16: _ClassVar[DataType]
    DT_UINT16: _ClassVar[DataType]
    DT_COMPLEX128: _ClassVar[DataType]
    DT_HALF: _ClassVar[DataType]
    DT_RESOURCE: _ClassVar[DataType]
    DT_VARIANT: _ClassVar[DataType]
    DT_UINT32: _ClassVar[DataType]
    DT_UINT64: _ClassVar[DataType]
    DT_FLOAT8_E5M2: _ClassVar[DataType]
    DT_FLOAT8_E4M3FN: _ClassVar[DataType]
    DT_FLOAT8_E4M3FNUZ: _ClassVar[DataType]
    DT_FLOAT8_E4M3B11FNUZ: _ClassVar[DataType]
    DT_FLOAT8_E5M2FNUZ: _ClassVar[DataType]
    DT_INT4: _ClassVar[DataType]
    DT_UINT4: _ClassVar[DataType]
    DT_INT2: _ClassVar[DataType]
    DT_UINT2: _ClassVar[DataType]
    DT_FLOAT4_E2M1FN: _ClassVar[DataType]
    DT_FLOAT_REF: _ClassVar[DataType]
    DT_DOUBLE_REF: _ClassVar[DataType]
    DT_INT32_REF: _ClassVar[DataType]
    DT_UINT8_REF: _ClassVar[DataType]
    DT_INT16_REF: _ClassVar[DataType]
    DT_INT8_REF: _ClassVar[DataType]
    DT_STRING_REF: _ClassVar[DataType]
    DT_COMPLEX64_REF: _ClassVar[DataType]
    DT_INT64_REF: _ClassVar[DataType]
    DT_BOOL_REF: _ClassVar[DataType]
    DT_QINT8_REF: _ClassVar[DataType]
    DT_QUINT8_REF: _ClassVar[DataType]
    DT_QINT32_REF: _ClassVar[DataType]
    DT_BFLOAT16_REF: _ClassVar[DataType]
    DT_QINT16_REF: _ClassVar[DataType]
    DT_QUINT16_REF: _ClassVar[DataType]
    DT_UINT16_REF: _ClassVar[DataType]
    DT_COMPLEX128_REF: _ClassVar[DataType]
    DT_HALF_REF: _ClassVar[DataType]
    DT_RESOURCE_REF: _ClassVar[DataType]
    DT_VARIANT_REF: _ClassVar[DataType]
    DT_UINT32_REF: _ClassVar[DataType]
    DT_UINT64_REF: _ClassVar[DataType]
    DT_FLOAT8_E5M2_REF: _ClassVar[DataType]
    DT_FLOAT8_E4M3FN_REF: _ClassVar[DataType]
    DT_FLOAT8_E4M3FNUZ_REF: _ClassVar[DataType]
    DT_FLOAT8_E4M3B11FNUZ_REF: _ClassVar[DataType]
    DT_FLOAT8_E5M2FNUZ_REF: _ClassVar[DataType]
    DT_INT4_REF: _ClassVar[DataType]
    DT_UINT4_REF: _ClassVar[DataType]
    DT_INT2_REF: _ClassVar[DataType]
    DT_UINT2_REF: _ClassVar[DataType]
    DT_FLOAT4_E2M1FN_REF: _ClassVar[DataType]
TFT_UNSET: FullTypeId
TFT_VAR: FullTypeId
TFT_ANY: FullTypeId
TFT_PRODUCT: FullTypeId
TFT_NAMED: FullTypeId
TFT_FOR_EACH: FullTypeId
TFT_CALLABLE: FullTypeId
TFT_TENSOR: FullTypeId
TFT_ARRAY: FullTypeId
TFT_OPTIONAL: FullTypeId
TFT_LITERAL: FullTypeId
TFT_ENCODED: FullTypeId
TFT_SHAPE_TENSOR: FullTypeId
TFT_BOOL: FullTypeId
TFT_UINT8: FullTypeId
TFT_UINT16: FullTypeId
TFT_UINT32: FullTypeId
TFT_UINT64: FullTypeId
TFT_INT8: FullTypeId
TFT_INT16: FullTypeId
TFT_INT32: FullTypeId
TFT_INT64: FullTypeId
TFT_HALF: FullTypeId
TFT_FLOAT: FullTypeId
TFT_DOUBLE: FullTypeId
TFT_BFLOAT16: FullTypeId
TFT_COMPLEX64: FullTypeId
TFT_COMPLEX128: FullTypeId
TFT_STRING: FullTypeId
TFT_DATASET: FullTypeId
TFT_RAGGED: FullTypeId
TFT_ITERATOR: FullTypeId
TFT_MUTEX_LOCK: FullTypeId
TFT_LEGACY_VARIANT: FullTypeId
DT_INVALID: DataType
DT_FLOAT: DataType
DT_DOUBLE: DataType
DT_INT32: DataType
DT_UINT8: DataType
DT_INT16: DataType
DT_INT8: DataType
DT_STRING: DataType
DT_COMPLEX64: DataType
DT_INT64: DataType
DT_BOOL: DataType
DT_QINT8: DataType
DT_QUINT8: DataType
DT_QINT32: DataType
DT_BFLOAT16: DataType
DT_QINT16: DataType
DT_QUINT16: DataType
DT_UINT16: DataType
DT_COMPLEX128: DataType
DT_HALF: DataType
DT_RESOURCE: DataType
DT_VARIANT: DataType
DT_UINT32: DataType
DT_UINT64: DataType
DT_FLOAT8_E5M2: DataType
DT_FLOAT8_E4M3FN: DataType
DT_FLOAT8_E4M3FNUZ: DataType
DT_FLOAT8_E4M3B11FNUZ: DataType
DT_FLOAT8_E5M2FNUZ: DataType
DT_INT4: DataType
DT_UINT4: DataType
DT_INT2: DataType
DT_UINT2: DataType
DT_FLOAT4_E2M1FN: DataType
DT_FLOAT_REF: DataType
DT_DOUBLE_REF: DataType
DT_INT32_REF: DataType
DT_UINT8_REF: DataType
DT_INT16_REF: DataType
DT_INT8_REF: DataType
DT_STRING_REF: DataType
DT_COMPLEX64_REF: DataType
DT_INT64_REF: DataType
DT_BOOL_REF: DataType
DT_QINT8_REF: DataType
DT_QUINT8_REF: DataType
DT_QINT32_REF: DataType
DT_BFLOAT16_REF: DataType
DT_QINT16_REF: DataType
DT_QUINT16_REF: DataType
DT_UINT16_REF: DataType
DT_COMPLEX128_REF: DataType
DT_HALF_REF: DataType
DT_RESOURCE_REF: DataType
DT_VARIANT_REF: DataType
DT_UINT32_REF: DataType
DT_UINT64_REF: DataType
DT_FLOAT8_E5M2_REF: DataType
DT_FLOAT8_E4M3FN_REF: DataType
DT_FLOAT8_E4M3FNUZ_REF: DataType
DT_FLOAT8_E4M3B11FNUZ_REF: DataType
DT_FLOAT8_E5M2FNUZ_REF: DataType
DT_INT4_REF: DataType
DT_UINT4_REF: DataType
DT_INT2_REF: DataType
DT_UINT2_REF: DataType
DT_FLOAT4_E2M1FN_REF: DataType

class GraphDef(_message.Message):
    __slots__ = ("node", "versions", "version", "library", "debug_info")
    NODE_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LIBRARY_FIELD_NUMBER: _ClassVar[int]
    DEBUG_INFO_FIELD_NUMBER: _ClassVar[int]
    node: _containers.RepeatedCompositeFieldContainer[NodeDef]
    versions: VersionDef
    version: int
    library: FunctionDefLibrary
    debug_info: GraphDebugInfo
    def __init__(self, node: _Optional[_Iterable[_Union[NodeDef, _Mapping]]] = ..., versions: _Optional[_Union[VersionDef, _Mapping]] = ..., version: _Optional[int] = ..., library: _Optional[_Union[FunctionDefLibrary, _Mapping]] = ..., debug_info: _Optional[_Union[GraphDebugInfo, _Mapping]] = ...) -> None: ...

class NodeDef(_message.Message):
    __slots__ = ("name", "op", "input", "device", "attr", "experimental_debug_info", "experimental_type")
    class AttrEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    class ExperimentalDebugInfo(_message.Message):
        __slots__ = ("original_node_names", "original_func_names")
        ORIGINAL_NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
        ORIGINAL_FUNC_NAMES_FIELD_NUMBER: _ClassVar[int]
        original_node_names: _containers.RepeatedScalarFieldContainer[str]
        original_func_names: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, original_node_names: _Optional[_Iterable[str]] = ..., original_func_names: _Optional[_Iterable[str]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENTAL_DEBUG_INFO_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENTAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: str
    input: _containers.RepeatedScalarFieldContainer[str]
    device: str
    attr: _containers.MessageMap[str, AttrValue]
    experimental_debug_info: NodeDef.ExperimentalDebugInfo
    experimental_type: FullTypeDef
    def __init__(self, name: _Optional[str] = ..., op: _Optional[str] = ..., input: _Optional[_Iterable[str]] = ..., device: _Optional[str] = ..., attr: _Optional[_Mapping[str, AttrValue]] = ..., experimental_debug_info: _Optional[_Union[NodeDef.ExperimentalDebugInfo, _Mapping]] = ..., experimental_type: _Optional[_Union[FullTypeDef, _Mapping]] = ...) -> None: ...

class AttrValue(_message.Message):
    __slots__ = ("s", "i", "f", "b", "type", "shape", "tensor", "list", "func", "placeholder")
    class ListValue(_message.Message):
        __slots__ = ("s", "i", "f", "b", "type", "shape", "tensor", "func")
        S_FIELD_NUMBER: _ClassVar[int]
        I_FIELD_NUMBER: _ClassVar[int]
        F_FIELD_NUMBER: _ClassVar[int]
        B_FIELD_NUMBER: _ClassVar[int]
        TYPE_FIELD_NUMBER: _ClassVar[int]
        SHAPE_FIELD_NUMBER: _ClassVar[int]
        TENSOR_FIELD_NUMBER: _ClassVar[int]
        FUNC_FIELD_NUMBER: _ClassVar[int]
        s: _containers.RepeatedScalarFieldContainer[bytes]
        i: _containers.RepeatedScalarFieldContainer[int]
        f: _containers.RepeatedScalarFieldContainer[float]
        b: _containers.RepeatedScalarFieldContainer[bool]
        type: _containers.RepeatedScalarFieldContainer[DataType]
        shape: _containers.RepeatedCompositeFieldContainer[TensorShapeProto]
        tensor: _containers.RepeatedCompositeFieldContainer[TensorProto]
        func: _containers.RepeatedCompositeFieldContainer[NameAttrList]
        def __init__(self, s: _Optional[_Iterable[bytes]] = ..., i: _Optional[_Iterable[int]] = ..., f: _Optional[_Iterable[float]] = ..., b: _Optional[_Iterable[bool]] = ..., type: _Optional[_Iterable[_Union[DataType, str]]] = ..., shape: _Optional[_Iterable[_Union[TensorShapeProto, _Mapping]]] = ..., tensor: _Optional[_Iterable[_Union[TensorProto, _Mapping]]] = ..., func: _Optional[_Iterable[_Union[NameAttrList, _Mapping]]] = ...) -> None: ...
    S_FIELD_NUMBER: _ClassVar[int]
    I_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    FUNC_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    s: bytes
    i: int
    f: float
    b: bool
    type: DataType
    shape: TensorShapeProto
    tensor: TensorProto
    list: AttrValue.ListValue
    func: NameAttrList
    placeholder: str
    def __init__(self, s: _Optional[bytes] = ..., i: _Optional[int] = ..., f: _Optional[float] = ..., b: _Optional[bool] = ..., type: _Optional[_Union[DataType, str]] = ..., shape: _Optional[_Union[TensorShapeProto, _Mapping]] = ..., tensor: _Optional[_Union[TensorProto, _Mapping]] = ..., list: _Optional[_Union[AttrValue.ListValue, _Mapping]] = ..., func: _Optional[_Union[NameAttrList, _Mapping]] = ..., placeholder: _Optional[str] = ...) -> None: ...

class NameAttrList(_message.Message):
    __slots__ = ("name", "attr")
    class AttrEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    name: str
    attr: _containers.MessageMap[str, AttrValue]
    def __init__(self, name: _Optional[str] = ..., attr: _Optional[_Mapping[str, AttrValue]] = ...) -> None: ...

class FullTypeDef(_message.Message):
    __slots__ = ("type_id", "args", "s", "i")
    TYPE_ID_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    S_FIELD_NUMBER: _ClassVar[int]
    I_FIELD_NUMBER: _ClassVar[int]
    type_id: FullTypeId
    args: _containers.RepeatedCompositeFieldContainer[FullTypeDef]
    s: str
    i: int
    def __init__(self, type_id: _Optional[_Union[FullTypeId, str]] = ..., args: _Optional[_Iterable[_Union[FullTypeDef, _Mapping]]] = ..., s: _Optional[str] = ..., i: _Optional[int] = ...) -> None: ...

class TensorShapeProto(_message.Message):
    __slots__ = ("dim", "unknown_rank")
    class Dim(_message.Message):
        __slots__ = ("size", "name")
        SIZE_FIELD_NUMBER: _ClassVar[int]
        NAME_FIELD_NUMBER: _ClassVar[int]
        size: int
        name: str
        def __init__(self, size: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...
    DIM_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_RANK_FIELD_NUMBER: _ClassVar[int]
    dim: _containers.RepeatedCompositeFieldContainer[TensorShapeProto.Dim]
    unknown_rank: bool
    def __init__(self, dim: _Optional[_Iterable[_Union[TensorShapeProto.Dim, _Mapping]]] = ..., unknown_rank: _Optional[bool] = ...) -> None: ...

class TensorProto(_message.Message):
    __slots__ = ("dtype", "tensor_shape", "version_number", "tensor_content", "half_val", "float_val", "double_val", "int_val", "string_val", "scomplex_val", "int64_val", "bool_val", "dcomplex_val", "resource_handle_val", "variant_val", "uint32_val", "uint64_val", "float8_val")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SHAPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_NUMBER_FIELD_NUMBER: _ClassVar[int]
    TENSOR_CONTENT_FIELD_NUMBER: _ClassVar[int]
    HALF_VAL_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VAL_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VAL_FIELD_NUMBER: _ClassVar[int]
    INT_VAL_FIELD_NUMBER: _ClassVar[int]
    STRING_VAL_FIELD_NUMBER: _ClassVar[int]
    SCOMPLEX_VAL_FIELD_NUMBER: _ClassVar[int]
    INT64_VAL_FIELD_NUMBER: _ClassVar[int]
    BOOL_VAL_FIELD_NUMBER: _ClassVar[int]
    DCOMPLEX_VAL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_HANDLE_VAL_FIELD_NUMBER: _ClassVar[int]
    VARIANT_VAL_FIELD_NUMBER: _ClassVar[int]
    UINT32_VAL_FIELD_NUMBER: _ClassVar[int]
    UINT64_VAL_FIELD_NUMBER: _ClassVar[int]
    FLOAT8_VAL_FIELD_NUMBER: _ClassVar[int]
    dtype: DataType
    tensor_shape: TensorShapeProto
    version_number: int
    tensor_content: bytes
    half_val: _containers.RepeatedScalarFieldContainer[int]
    float_val: _containers.RepeatedScalarFieldContainer[float]
    double_val: _containers.RepeatedScalarFieldContainer[float]
    int_val: _containers.RepeatedScalarFieldContainer[int]
    string_val: _containers.RepeatedScalarFieldContainer[bytes]
    scomplex_val: _containers.RepeatedScalarFieldContainer[float]
    int64_val: _containers.RepeatedScalarFieldContainer[int]
    bool_val: _containers.RepeatedScalarFieldContainer[bool]
    dcomplex_val: _containers.RepeatedScalarFieldContainer[float]
    resource_handle_val: _containers.RepeatedCompositeFieldContainer[ResourceHandleProto]
    variant_val: _containers.RepeatedCompositeFieldContainer[VariantTensorDataProto]
    uint32_val: _containers.RepeatedScalarFieldContainer[int]
    uint64_val: _containers.RepeatedScalarFieldContainer[int]
    float8_val: bytes
    def __init__(self, dtype: _Optional[_Union[DataType, str]] = ..., tensor_shape: _Optional[_Union[TensorShapeProto, _Mapping]] = ..., version_number: _Optional[int] = ..., tensor_content: _Optional[bytes] = ..., half_val: _Optional[_Iterable[int]] = ..., float_val: _Optional[_Iterable[float]] = ..., double_val: _Optional[_Iterable[float]] = ..., int_val: _Optional[_Iterable[int]] = ..., string_val: _Optional[_Iterable[bytes]] = ..., scomplex_val: _Optional[_Iterable[float]] = ..., int64_val: _Optional[_Iterable[int]] = ..., bool_val: _Optional[_Iterable[bool]] = ..., dcomplex_val: _Optional[_Iterable[float]] = ..., resource_handle_val: _Optional[_Iterable[_Union[ResourceHandleProto, _Mapping]]] = ..., variant_val: _Optional[_Iterable[_Union[VariantTensorDataProto, _Mapping]]] = ..., uint32_val: _Optional[_Iterable[int]] = ..., uint64_val: _Optional[_Iterable[int]] = ..., float8_val: _Optional[bytes] = ...) -> None: ...

class VariantTensorDataProto(_message.Message):
    __slots__ = ("type_name", "metadata", "tensors")
    TYPE_NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    type_name: str
    metadata: bytes
    tensors: _containers.RepeatedCompositeFieldContainer[TensorProto]
    def __init__(self, type_name: _Optional[str] = ..., metadata: _Optional[bytes] = ..., tensors: _Optional[_Iterable[_Union[TensorProto, _Mapping]]] = ...) -> None: ...

class ResourceHandleProto(_message.Message):
    __slots__ = ("device", "container", "name", "hash_code", "maybe_type_name", "dtypes_and_shapes")
    class DtypeAndShape(_message.Message):
        __slots__ = ("dtype", "shape")
        DTYPE_FIELD_NUMBER: _ClassVar[int]
        SHAPE_FIELD_NUMBER: _ClassVar[int]
        dtype: DataType
        shape: TensorShapeProto
        def __init__(self, dtype: _Optional[_Union[DataType, str]] = ..., shape: _Optional[_Union[TensorShapeProto, _Mapping]] = ...) -> None: ...
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HASH_CODE_FIELD_NUMBER: _ClassVar[int]
    MAYBE_TYPE_NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPES_AND_SHAPES_FIELD_NUMBER: _ClassVar[int]
    device: str
    container: str
    name: str
    hash_code: int
    maybe_type_name: str
    dtypes_and_shapes: _containers.RepeatedCompositeFieldContainer[ResourceHandleProto.DtypeAndShape]
    def __init__(self, device: _Optional[str] = ..., container: _Optional[str] = ..., name: _Optional[str] = ..., hash_code: _Optional[int] = ..., maybe_type_name: _Optional[str] = ..., dtypes_and_shapes: _Optional[_Iterable[_Union[ResourceHandleProto.DtypeAndShape, _Mapping]]] = ...) -> None: ...

class VersionDef(_message.Message):
    __slots__ = ("producer", "min_consumer", "bad_consumers")
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    MIN_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    BAD_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    producer: int
    min_consumer: int
    bad_consumers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, producer: _Optional[int] = ..., min_consumer: _Optional[int] = ..., bad_consumers: _Optional[_Iterable[int]] = ...) -> None: ...

class FunctionDefLibrary(_message.Message):
    __slots__ = ("function", "gradient", "registered_gradients")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    function: _containers.RepeatedCompositeFieldContainer[FunctionDef]
    gradient: _containers.RepeatedCompositeFieldContainer[GradientDef]
    registered_gradients: _containers.RepeatedCompositeFieldContainer[RegisteredGradient]
    def __init__(self, function: _Optional[_Iterable[_Union[FunctionDef, _Mapping]]] = ..., gradient: _Optional[_Iterable[_Union[GradientDef, _Mapping]]] = ..., registered_gradients: _Optional[_Iterable[_Union[RegisteredGradient, _Mapping]]] = ...) -> None: ...

class FunctionDef(_message.Message):
    __slots__ = ("signature", "attr", "arg_attr", "resource_arg_unique_id", "node_def", "ret", "control_ret")
    class AttrEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    class ArgAttrs(_message.Message):
        __slots__ = ("attr",)
        class AttrEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: AttrValue
            def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
        ATTR_FIELD_NUMBER: _ClassVar[int]
        attr: _containers.MessageMap[str, AttrValue]
        def __init__(self, attr: _Optional[_Mapping[str, AttrValue]] = ...) -> None: ...
    class ArgAttrEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: FunctionDef.ArgAttrs
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[FunctionDef.ArgAttrs, _Mapping]] = ...) -> None: ...
    class ResourceArgUniqueIdEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class RetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ControlRetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    ARG_ATTR_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ARG_UNIQUE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_DEF_FIELD_NUMBER: _ClassVar[int]
    RET_FIELD_NUMBER: _ClassVar[int]
    CONTROL_RET_FIELD_NUMBER: _ClassVar[int]
    signature: OpDef
    attr: _containers.MessageMap[str, AttrValue]
    arg_attr: _containers.MessageMap[int, FunctionDef.ArgAttrs]
    resource_arg_unique_id: _containers.ScalarMap[int, int]
    node_def: _containers.RepeatedCompositeFieldContainer[NodeDef]
    ret: _containers.ScalarMap[str, str]
    control_ret: _containers.ScalarMap[str, str]
    def __init__(self, signature: _Optional[_Union[OpDef, _Mapping]] = ..., attr: _Optional[_Mapping[str, AttrValue]] = ..., arg_attr: _Optional[_Mapping[int, FunctionDef.ArgAttrs]] = ..., resource_arg_unique_id: _Optional[_Mapping[int, int]] = ..., node_def: _Optional[_Iterable[_Union[NodeDef, _Mapping]]] = ..., ret: _Optional[_Mapping[str, str]] = ..., control_ret: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GradientDef(_message.Message):
    __slots__ = ("function_name", "gradient_func")
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FUNC_FIELD_NUMBER: _ClassVar[int]
    function_name: str
    gradient_func: str
    def __init__(self, function_name: _Optional[str] = ..., gradient_func: _Optional[str] = ...) -> None: ...

class RegisteredGradient(_message.Message):
    __slots__ = ("gradient_func", "registered_op_type")
    GRADIENT_FUNC_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_OP_TYPE_FIELD_NUMBER: _ClassVar[int]
    gradient_func: str
    registered_op_type: str
    def __init__(self, gradient_func: _Optional[str] = ..., registered_op_type: _Optional[str] = ...) -> None: ...

class OpDef(_message.Message):
    __slots__ = ("name", "input_arg", "output_arg", "control_output", "attr", "deprecation", "summary", "description", "is_commutative", "is_aggregate", "is_stateful", "allows_uninitialized_input", "is_distributed_communication")
    class ArgDef(_message.Message):
        __slots__ = ("name", "description", "type", "type_attr", "number_attr", "type_list_attr", "handle_data", "is_ref", "experimental_full_type")
        NAME_FIELD_NUMBER: _ClassVar[int]
        DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
        TYPE_FIELD_NUMBER: _ClassVar[int]
        TYPE_ATTR_FIELD_NUMBER: _ClassVar[int]
        NUMBER_ATTR_FIELD_NUMBER: _ClassVar[int]
        TYPE_LIST_ATTR_FIELD_NUMBER: _ClassVar[int]
        HANDLE_DATA_FIELD_NUMBER: _ClassVar[int]
        IS_REF_FIELD_NUMBER: _ClassVar[int]
        EXPERIMENTAL_FULL_TYPE_FIELD_NUMBER: _ClassVar[int]
        name: str
        description: str
        type: DataType
        type_attr: str
        number_attr: str
        type_list_attr: str
        handle_data: _containers.RepeatedCompositeFieldContainer[ResourceHandleProto.DtypeAndShape]
        is_ref: bool
        experimental_full_type: FullTypeDef
        def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., type: _Optional[_Union[DataType, str]] = ..., type_attr: _Optional[str] = ..., number_attr: _Optional[str] = ..., type_list_attr: _Optional[str] = ..., handle_data: _Optional[_Iterable[_Union[ResourceHandleProto.DtypeAndShape, _Mapping]]] = ..., is_ref: _Optional[bool] = ..., experimental_full_type: _Optional[_Union[FullTypeDef, _Mapping]] = ...) -> None: ...
    class AttrDef(_message.Message):
        __slots__ = ("name", "type", "default_value", "description", "has_minimum", "minimum", "allowed_values")
        NAME_FIELD_NUMBER: _ClassVar[int]
        TYPE_FIELD_NUMBER: _ClassVar[int]
        DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
        DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
        HAS_MINIMUM_FIELD_NUMBER: _ClassVar[int]
        MINIMUM_FIELD_NUMBER: _ClassVar[int]
        ALLOWED_VALUES_FIELD_NUMBER: _ClassVar[int]
        name: str
        type: str
        default_value: AttrValue
        description: str
        has_minimum: bool
        minimum: int
        allowed_values: AttrValue
        def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., default_value: _Optional[_Union[AttrValue, _Mapping]] = ..., description: _Optional[str] = ..., has_minimum: _Optional[bool] = ..., minimum: _Optional[int] = ..., allowed_values: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_ARG_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ARG_FIELD_NUMBER: _ClassVar[int]
    CONTROL_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    DEPRECATION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    IS_COMMUTATIVE_FIELD_NUMBER: _ClassVar[int]
    IS_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    IS_STATEFUL_FIELD_NUMBER: _ClassVar[int]
    ALLOWS_UNINITIALIZED_INPUT_FIELD_NUMBER: _ClassVar[int]
    IS_DISTRIBUTED_COMMUNICATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    input_arg: _containers.RepeatedCompositeFieldContainer[OpDef.ArgDef]
    output_arg: _containers.RepeatedCompositeFieldContainer[OpDef.ArgDef]
    control_output: _containers.RepeatedScalarFieldContainer[str]
    attr: _containers.RepeatedCompositeFieldContainer[OpDef.AttrDef]
    deprecation: OpDeprecation
    summary: str
    description: str
    is_commutative: bool
    is_aggregate: bool
    is_stateful: bool
    allows_uninitialized_input: bool
    is_distributed_communication: bool
    def __init__(self, name: _Optional[str] = ..., input_arg: _Optional[_Iterable[_Union[OpDef.ArgDef, _Mapping]]] = ..., output_arg: _Optional[_Iterable[_Union[OpDef.ArgDef, _Mapping]]] = ..., control_output: _Optional[_Iterable[str]] = ..., attr: _Optional[_Iterable[_Union[OpDef.AttrDef, _Mapping]]] = ..., deprecation: _Optional[_Union[OpDeprecation, _Mapping]] = ..., summary: _Optional[str] = ..., description: _Optional[str] = ..., is_commutative: _Optional[bool] = ..., is_aggregate: _Optional[bool] = ..., is_stateful: _Optional[bool] = ..., allows_uninitialized_input: _Optional[bool] = ..., is_distributed_communication: _Optional[bool] = ...) -> None: ...

class OpDeprecation(_message.Message):
    __slots__ = ("version", "explanation")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    version: int
    explanation: str
    def __init__(self, version: _Optional[int] = ..., explanation: _Optional[str] = ...) -> None: ...

class GraphDebugInfo(_message.Message):
    __slots__ = ("files", "frames_by_id", "traces_by_id", "traces", "name_to_trace_id")
    class FileLineCol(_message.Message):
        __slots__ = ("file_index", "line", "col", "func", "code")
        FILE_INDEX_FIELD_NUMBER: _ClassVar[int]
        LINE_FIELD_NUMBER: _ClassVar[int]
        COL_FIELD_NUMBER: _ClassVar[int]
        FUNC_FIELD_NUMBER: _ClassVar[int]
        CODE_FIELD_NUMBER: _ClassVar[int]
        file_index: int
        line: int
        col: int
        func: str
        code: str
        def __init__(self, file_index: _Optional[int] = ..., line: _Optional[int] = ..., col: _Optional[int] = ..., func: _Optional[str] = ..., code: _Optional[str] = ...) -> None: ...
    class StackTrace(_message.Message):
        __slots__ = ("file_line_cols", "frame_id")
        FILE_LINE_COLS_FIELD_NUMBER: _ClassVar[int]
        FRAME_ID_FIELD_NUMBER: _ClassVar[int]
        file_line_cols: _containers.RepeatedCompositeFieldContainer[GraphDebugInfo.FileLineCol]
        frame_id: _containers.RepeatedScalarFieldContainer[int]
        def __init__(self, file_line_cols: _Optional[_Iterable[_Union[GraphDebugInfo.FileLineCol, _Mapping]]] = ..., frame_id: _Optional[_Iterable[int]] = ...) -> None: ...
    class FramesByIdEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: GraphDebugInfo.FileLineCol
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[GraphDebugInfo.FileLineCol, _Mapping]] = ...) -> None: ...
    class TracesByIdEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: GraphDebugInfo.StackTrace
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[GraphDebugInfo.StackTrace, _Mapping]] = ...) -> None: ...
    class TracesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: GraphDebugInfo.StackTrace
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[GraphDebugInfo.StackTrace, _Mapping]] = ...) -> None: ...
    class NameToTraceIdEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    FILES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_BY_ID_FIELD_NUMBER: _ClassVar[int]
    TRACES_BY_ID_FIELD_NUMBER: _ClassVar[int]
    TRACES_FIELD_NUMBER: _ClassVar[int]
    NAME_TO_TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedScalarFieldContainer[str]
    frames_by_id: _containers.MessageMap[int, GraphDebugInfo.FileLineCol]
    traces_by_id: _containers.MessageMap[int, GraphDebugInfo.StackTrace]
    traces: _containers.MessageMap[str, GraphDebugInfo.StackTrace]
    name_to_trace_id: _containers.ScalarMap[str, int]
    def __init__(self, files: _Optional[_Iterable[str]] = ..., frames_by_id: _Optional[_Mapping[int, GraphDebugInfo.FileLineCol]] = ..., traces_by_id: _Optional[_Mapping[int, GraphDebugInfo.StackTrace]] = ..., traces: _Optional[_Mapping[str, GraphDebugInfo.StackTrace]] = ..., name_to_trace_id: _Optional[_Mapping[str, int]] = ...) -> None: ...
