from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CostProfile(_message.Message):
    __slots__ = ("schema", "source", "device", "model", "totals", "ops", "edges", "coverage", "measurement", "generator")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    schema: str
    source: str
    device: str
    model: Model
    totals: Totals
    ops: _containers.RepeatedCompositeFieldContainer[OpProfile]
    edges: _containers.RepeatedCompositeFieldContainer[EdgeProfile]
    coverage: _containers.RepeatedCompositeFieldContainer[RuleCoverage]
    measurement: Measurement
    generator: str
    def __init__(self, schema: _Optional[str] = ..., source: _Optional[str] = ..., device: _Optional[str] = ..., model: _Optional[_Union[Model, _Mapping]] = ..., totals: _Optional[_Union[Totals, _Mapping]] = ..., ops: _Optional[_Iterable[_Union[OpProfile, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[EdgeProfile, _Mapping]]] = ..., coverage: _Optional[_Iterable[_Union[RuleCoverage, _Mapping]]] = ..., measurement: _Optional[_Union[Measurement, _Mapping]] = ..., generator: _Optional[str] = ...) -> None: ...

class Model(_message.Message):
    __slots__ = ("path", "sha256", "format", "ops", "edges", "batch_size", "training")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    path: str
    sha256: str
    format: str
    ops: int
    edges: int
    batch_size: int
    training: str
    def __init__(self, path: _Optional[str] = ..., sha256: _Optional[str] = ..., format: _Optional[str] = ..., ops: _Optional[int] = ..., edges: _Optional[int] = ..., batch_size: _Optional[int] = ..., training: _Optional[str] = ...) -> None: ...

class Totals(_message.Message):
    __slots__ = ("compute_us", "flops", "persistent_bytes", "peak_activation_bytes", "temporary_bytes", "measured_ops", "analytic_ops", "single_device_step_us")
    COMPUTE_US_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_ACTIVATION_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMPORARY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_OPS_FIELD_NUMBER: _ClassVar[int]
    ANALYTIC_OPS_FIELD_NUMBER: _ClassVar[int]
    SINGLE_DEVICE_STEP_US_FIELD_NUMBER: _ClassVar[int]
    compute_us: float
    flops: float
    persistent_bytes: float
    peak_activation_bytes: float
    temporary_bytes: float
    measured_ops: int
    analytic_ops: int
    single_device_step_us: float
    def __init__(self, compute_us: _Optional[float] = ..., flops: _Optional[float] = ..., persistent_bytes: _Optional[float] = ..., peak_activation_bytes: _Optional[float] = ..., temporary_bytes: _Optional[float] = ..., measured_ops: _Optional[int] = ..., analytic_ops: _Optional[int] = ..., single_device_step_us: _Optional[float] = ...) -> None: ...

class OpProfile(_message.Message):
    __slots__ = ("name", "type", "compute_us", "flops", "output_bytes", "temporary_bytes", "persistent_bytes", "source", "device", "rule")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_US_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMPORARY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    compute_us: float
    flops: float
    output_bytes: _containers.RepeatedScalarFieldContainer[float]
    temporary_bytes: float
    persistent_bytes: float
    source: str
    device: str
    rule: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., compute_us: _Optional[float] = ..., flops: _Optional[float] = ..., output_bytes: _Optional[_Iterable[float]] = ..., temporary_bytes: _Optional[float] = ..., persistent_bytes: _Optional[float] = ..., source: _Optional[str] = ..., device: _Optional[str] = ..., rule: _Optional[str] = ...) -> None: ...

class EdgeProfile(_message.Message):
    __slots__ = ("src", "port", "dst", "transfer_us")
    SRC_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_US_FIELD_NUMBER: _ClassVar[int]
    src: str
    port: int
    dst: str
    transfer_us: float
    def __init__(self, src: _Optional[str] = ..., port: _Optional[int] = ..., dst: _Optional[str] = ..., transfer_us: _Optional[float] = ...) -> None: ...

class RuleCoverage(_message.Message):
    __slots__ = ("op_type", "rule", "ops")
    OP_TYPE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    op_type: str
    rule: str
    ops: int
    def __init__(self, op_type: _Optional[str] = ..., rule: _Optional[str] = ..., ops: _Optional[int] = ...) -> None: ...

class Measurement(_message.Message):
    __slots__ = ("tensorflow", "warmup", "steps", "init_op", "fetches", "not_run", "not_run_count", "torch", "threads")
    TENSORFLOW_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    INIT_OP_FIELD_NUMBER: _ClassVar[int]
    FETCHES_FIELD_NUMBER: _ClassVar[int]
    NOT_RUN_FIELD_NUMBER: _ClassVar[int]
    NOT_RUN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TORCH_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    tensorflow: str
    warmup: int
    steps: int
    init_op: str
    fetches: _containers.RepeatedScalarFieldContainer[str]
    not_run: _containers.RepeatedScalarFieldContainer[str]
    not_run_count: int
    torch: str
    threads: int
    def __init__(self, tensorflow: _Optional[str] = ..., warmup: _Optional[int] = ..., steps: _Optional[int] = ..., init_op: _Optional[str] = ..., fetches: _Optional[_Iterable[str]] = ..., not_run: _Optional[_Iterable[str]] = ..., not_run_count: _Optional[int] = ..., torch: _Optional[str] = ..., threads: _Optional[int] = ...) -> None: ...
