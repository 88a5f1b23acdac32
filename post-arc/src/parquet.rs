//! `itrace export --format parquet`: the arc as a table, one row per line of the arc (a block
//! of instructions ending in a taken branch, or a thread's last unfinished block), with typed
//! columns, for DuckDB, pandas, Spark and the like. Schema: docs/arc-and-report.md, "Parquet".
//!
//! Rows are buffered in compact columns (strings as ids into one table of distinct strings) and
//! written as a row group of a fixed number of rows ([`ROWS_PER_GROUP`] by default) at a time, so memory stays bounded
//! whatever the trace's length. String columns are dictionary-encoded by the writer; pages are
//! zstd-compressed.

use crate::replay::{replay, Block, GapCause, Sink, Where};
use crate::resolve::{Location, Resolver};
use crate::stacks::{CallStacks, Collect, Opened};
use crate::threads::Names;
use crate::{PostError, Trace};
use ::parquet::basic::{Compression, ZstdLevel};
use ::parquet::data_type::{ByteArray, ByteArrayType, DataType, Int32Type, Int64Type};
use ::parquet::errors::ParquetError;
use ::parquet::file::metadata::KeyValue;
use ::parquet::file::properties::{EnabledStatistics, WriterProperties};
use ::parquet::file::writer::{SerializedFileWriter, SerializedRowGroupWriter};
use ::parquet::schema::types::ColumnPath;
use itrace_format::{BranchKind, Lost, TraceOff};
use rustc_hash::FxHashMap;
use std::io::Write;
use std::rc::Rc;
use std::sync::Arc;

/// Rows per row group by default (DuckDB writes 122,880): measured on a trace of 2.6 M blocks, 1 M rows
/// a group took 173 MB beyond what reading the trace takes and 2^18 took 43 MB, for a file
/// 16% larger (fewer repeats per dictionary) and no slower.
pub const ROWS_PER_GROUP: usize = 1 << 18;

/// The table's schema (Parquet's message syntax); the columns are written in this order.
const SCHEMA: &str = "
message itrace_blocks {
  required int64 seq (INTEGER(64,false));
  required int64 timestamp_ns (INTEGER(64,false));
  optional int32 cpu (INTEGER(16,false));
  required int32 pid (INTEGER(32,false));
  required int32 tid (INTEGER(32,false));
  required binary process (STRING);
  required binary thread (STRING);
  required binary mode (STRING);
  required binary kind (STRING);
  required int32 instructions (INTEGER(32,false));
  optional int64 address (INTEGER(64,false));
  required binary function (STRING);
  required int64 function_offset (INTEGER(64,false));
  required binary module (STRING);
  optional binary file (STRING);
  optional int32 line (INTEGER(32,false));
  optional int64 from_address (INTEGER(64,false));
  optional int64 to_address (INTEGER(64,false));
  optional binary to_function (STRING);
  optional int64 to_function_offset (INTEGER(64,false));
  optional binary to_module (STRING);
  optional binary call_kind (STRING);
  optional binary called_function (STRING);
  optional binary called_module (STRING);
}";

/// The string columns of [`SCHEMA`].
const STRING_COLUMNS: [&str; 12] = [
    "process",
    "thread",
    "mode",
    "kind",
    "function",
    "module",
    "file",
    "to_function",
    "to_module",
    "call_kind",
    "called_function",
    "called_module",
];

/// The `call_kind` of a call the report counts.
fn call_kind_name(how: Opened) -> &'static str {
    match how {
        Opened::Call => "call",
        Opened::PltCall => "plt_call",
        Opened::TailCall => "tail_call",
        Opened::SignalHandler => "signal",
        // Not counted as calls.
        Opened::SignalTrampoline | Opened::Root => "none",
    }
}

/// The `kind` of a thread's last block, which ended without a branch (the arc's OTHER line
/// before `# end of trace`).
const END_KIND: &str = "end";

/// The `kind` column's value for a branch kind: the arc's field 9 in lower case, except that a
/// taken conditional jump (the arc's JUMP) is `cond_jump`.
fn kind_name(kind: BranchKind) -> &'static str {
    match kind {
        BranchKind::Intrpt => "intrpt",
        BranchKind::Call => "call",
        BranchKind::Return => "return",
        BranchKind::Jump => "jump",
        BranchKind::CondJump => "cond_jump",
        BranchKind::Iret => "iret",
        BranchKind::Other => "other",
        BranchKind::Undefd => "undefd",
        BranchKind::Alloc => "alloc",
    }
}

/// What was written.
#[derive(Clone, Debug, Default)]
pub struct ParquetStats {
    /// Rows: taken branches plus the threads' last unfinished blocks.
    pub rows: u64,
    /// Rows of taken branches (kind other than `end`): the report's taken branches.
    pub branches: u64,
    pub row_groups: u64,
    /// The sum of the `instructions` column.
    pub instructions: u64,
    /// Rows with a `call_kind`: the calls the report counts.
    pub calls: u64,
    /// Calls the report counts that no row holds: counted where no row was written (a PLT
    /// call whose target was never seen, closed at the end of the trace), or a second call
    /// counted at one row.
    pub calls_without_row: u64,
    /// Warnings and hints about the names, as in [`crate::report::Report::notes`].
    pub notes: Vec<String>,
}

/// Every distinct string of the table, by id: a row keeps ids, and its row group's string
/// columns are made of these values (shared, not copied) when it is written.
#[derive(Default)]
struct Strings {
    ids: FxHashMap<Box<str>, u32>,
    values: Vec<ByteArray>,
}

impl Strings {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.values.len() as u32;
        self.values.push(ByteArray::from(s));
        self.ids.insert(s.into(), id);
        id
    }
}

/// One column of the row group being filled: its non-null values, and for an optional column
/// the definition level of each row (1: a value, 0: null).
struct Col<T> {
    values: Vec<T>,
    defs: Option<Vec<i16>>,
}

impl<T> Col<T> {
    fn required() -> Self {
        Col { values: Vec::new(), defs: None }
    }

    fn optional() -> Self {
        Col { values: Vec::new(), defs: Some(Vec::new()) }
    }

    fn push(&mut self, v: T) {
        self.values.push(v);
        if let Some(d) = &mut self.defs {
            d.push(1);
        }
    }

    /// A value or null; null only in an optional column.
    fn push_opt(&mut self, v: Option<T>) {
        match (v, &mut self.defs) {
            (Some(v), _) => self.push(v),
            (None, Some(d)) => d.push(0),
            (None, None) => unreachable!("null in a required column"),
        }
    }

    fn clear(&mut self) {
        self.values.clear();
        if let Some(d) = &mut self.defs {
            d.clear();
        }
    }
}

/// The columns of [`SCHEMA`], in its order. Unsigned values are stored in their signed
/// physical type, as Parquet's unsigned integer types are.
struct Rows {
    seq: Col<i64>,
    timestamp_ns: Col<i64>,
    cpu: Col<i32>,
    pid: Col<i32>,
    tid: Col<i32>,
    process: Col<u32>,
    thread: Col<u32>,
    mode: Col<u32>,
    kind: Col<u32>,
    instructions: Col<i32>,
    address: Col<i64>,
    function: Col<u32>,
    function_offset: Col<i64>,
    module: Col<u32>,
    file: Col<u32>,
    line: Col<i32>,
    from_address: Col<i64>,
    to_address: Col<i64>,
    to_function: Col<u32>,
    to_function_offset: Col<i64>,
    to_module: Col<u32>,
    call_kind: Col<u32>,
    called_function: Col<u32>,
    called_module: Col<u32>,
}

impl Rows {
    fn new() -> Self {
        Rows {
            seq: Col::required(),
            timestamp_ns: Col::required(),
            cpu: Col::optional(),
            pid: Col::required(),
            tid: Col::required(),
            process: Col::required(),
            thread: Col::required(),
            mode: Col::required(),
            kind: Col::required(),
            instructions: Col::required(),
            address: Col::optional(),
            function: Col::required(),
            function_offset: Col::required(),
            module: Col::required(),
            file: Col::optional(),
            line: Col::optional(),
            from_address: Col::optional(),
            to_address: Col::optional(),
            to_function: Col::optional(),
            to_function_offset: Col::optional(),
            to_module: Col::optional(),
            call_kind: Col::optional(),
            called_function: Col::optional(),
            called_module: Col::optional(),
        }
    }

    fn len(&self) -> usize {
        self.seq.values.len()
    }

    /// Write the rows as one row group, then empty the columns.
    fn write_group<W: Write + Send>(
        &mut self,
        w: &mut SerializedFileWriter<W>,
        strings: &Strings,
    ) -> Result<(), ParquetError> {
        let mut g = w.next_row_group()?;
        let strs = |c: &Col<u32>| Col {
            values: c.values.iter().map(|&id| strings.values[id as usize].clone()).collect(),
            defs: c.defs.clone(),
        };
        write_col::<Int64Type, W>(&mut g, &self.seq)?;
        write_col::<Int64Type, W>(&mut g, &self.timestamp_ns)?;
        write_col::<Int32Type, W>(&mut g, &self.cpu)?;
        write_col::<Int32Type, W>(&mut g, &self.pid)?;
        write_col::<Int32Type, W>(&mut g, &self.tid)?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.process))?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.thread))?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.mode))?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.kind))?;
        write_col::<Int32Type, W>(&mut g, &self.instructions)?;
        write_col::<Int64Type, W>(&mut g, &self.address)?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.function))?;
        write_col::<Int64Type, W>(&mut g, &self.function_offset)?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.module))?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.file))?;
        write_col::<Int32Type, W>(&mut g, &self.line)?;
        write_col::<Int64Type, W>(&mut g, &self.from_address)?;
        write_col::<Int64Type, W>(&mut g, &self.to_address)?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.to_function))?;
        write_col::<Int64Type, W>(&mut g, &self.to_function_offset)?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.to_module))?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.call_kind))?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.called_function))?;
        write_col::<ByteArrayType, W>(&mut g, &strs(&self.called_module))?;
        if g.next_column()?.is_some() {
            return Err(ParquetError::General("the schema has more columns than itrace writes".into()));
        }
        g.close()?;
        for c in [&mut self.seq, &mut self.timestamp_ns, &mut self.address, &mut self.function_offset] {
            c.clear();
        }
        for c in [&mut self.from_address, &mut self.to_address, &mut self.to_function_offset] {
            c.clear();
        }
        for c in [&mut self.cpu, &mut self.pid, &mut self.tid, &mut self.instructions, &mut self.line] {
            c.clear();
        }
        for c in [&mut self.process, &mut self.thread, &mut self.mode, &mut self.kind, &mut self.function] {
            c.clear();
        }
        for c in [&mut self.module, &mut self.file, &mut self.to_function, &mut self.to_module] {
            c.clear();
        }
        for c in [&mut self.call_kind, &mut self.called_function, &mut self.called_module] {
            c.clear();
        }
        Ok(())
    }
}

/// Write `col` as the row group's next column.
fn write_col<T: DataType, W: Write + Send>(
    g: &mut SerializedRowGroupWriter<'_, W>,
    col: &Col<T::T>,
) -> Result<(), ParquetError> {
    let mut c = g
        .next_column()?
        .ok_or_else(|| ParquetError::General("the schema has fewer columns than itrace writes".into()))?;
    c.typed::<T>().write_batch(&col.values, col.defs.as_deref(), None)?;
    c.close()
}

/// (function, module) string ids of a location.
fn func_ids(cache: &mut Vec<Option<(u32, u32)>>, strings: &mut Strings, l: &Location) -> (u32, u32) {
    let i = l.func as usize;
    if i >= cache.len() {
        cache.resize(i + 1, None);
    }
    *cache[i].get_or_insert_with(|| (strings.id(&l.symbol), strings.id(&l.module)))
}

struct ParquetSink<W: Write + Send> {
    writer: SerializedFileWriter<W>,
    /// The report's call stacks, for the calls it counts (`call_kind`).
    stacks: CallStacks,
    rows: Rows,
    rows_per_group: usize,
    strings: Strings,
    /// String ids of each resolver function id's (symbol, module).
    funcs: Vec<Option<(u32, u32)>>,
    /// The same for `called_function` and `called_module` (from the resolver's names).
    called: Vec<Option<(u32, u32)>>,
    /// The last source file seen and its string id (consecutive blocks are mostly in one file).
    last_file: Option<(Arc<str>, u32)>,
    kinds: [u32; 9],
    end_kind: u32,
    user: u32,
    kernel: u32,
    kernel_module: u32,
    /// Records lost, as the Lost records say.
    lost: u64,
    stats: ParquetStats,
}

impl<W: Write + Send> ParquetSink<W> {
    fn file_id(&mut self, file: &Arc<str>) -> u32 {
        match &self.last_file {
            Some((f, id)) if Arc::ptr_eq(f, file) => *id,
            _ => {
                let id = self.strings.id(file);
                self.last_file = Some((file.clone(), id));
                id
            }
        }
    }

    /// The columns every row has, and the count of it.
    #[allow(clippy::too_many_arguments)]
    fn start_row(&mut self, ts: u64, cpu: Option<u16>, pid: u32, tid: u32, mode: u32, kind: u32, count: u32) {
        let r = &mut self.rows;
        r.seq.push(self.stats.rows as i64);
        r.timestamp_ns.push(ts as i64);
        r.cpu.push_opt(cpu.map(i32::from));
        r.pid.push(pid as i32);
        r.tid.push(tid as i32);
        r.mode.push(mode);
        r.kind.push(kind);
        r.instructions.push(count as i32);
        self.stats.rows += 1;
        self.stats.instructions += count as u64;
    }

    fn names(&mut self, names: &Names, pid: u32, tid: u32) {
        let process = self.strings.id(names.process_name(pid));
        let thread = self.strings.id(names.thread_name(tid));
        self.rows.process.push(process);
        self.rows.thread.push(thread);
    }

    /// The block's location columns (`address` to `line`).
    fn location(&mut self, address: Option<u64>, l: &Location) {
        let (function, module) = func_ids(&mut self.funcs, &mut self.strings, l);
        let file = match &l.file {
            Some(f) if l.line != 0 => Some(self.file_id(f)),
            _ => None,
        };
        let r = &mut self.rows;
        r.address.push_opt(address.map(|a| a as i64));
        r.function.push(function);
        r.function_offset.push(l.offset as i64);
        r.module.push(module);
        r.file.push_opt(file);
        r.line.push_opt(file.map(|_| l.line as i32));
    }

    /// The branch's columns (`from_address` to `to_module`); `to` resolved when there is one.
    fn branch(&mut self, from: Option<u64>, to: Option<(u64, Option<Rc<Location>>)>) {
        let r = &mut self.rows;
        r.from_address.push_opt(from.map(|a| a as i64));
        r.to_address.push_opt(to.as_ref().map(|(a, _)| *a as i64));
        match to.and_then(|(_, l)| l) {
            Some(l) => {
                let (function, module) = func_ids(&mut self.funcs, &mut self.strings, &l);
                let r = &mut self.rows;
                r.to_function.push(function);
                r.to_function_offset.push(l.offset as i64);
                r.to_module.push(module);
            }
            None => {
                r.to_function.push_opt(None);
                r.to_function_offset.push_opt(None);
                r.to_module.push_opt(None);
            }
        }
    }

    /// The row's call columns: the call the report counted with it, if any (by the call
    /// stacks, given the row's record just before).
    fn calls(&mut self, res: &Resolver) {
        let mut counted = self.stacks.drain_calls();
        let first = counted.next();
        let more = counted.count() as u64;
        self.stats.calls_without_row += more;
        let r = &mut self.rows;
        match first {
            Some(c) => {
                let i = c.func as usize;
                if i >= self.called.len() {
                    self.called.resize(i + 1, None);
                }
                let strings = &mut self.strings;
                let (function, module) = *self.called[i].get_or_insert_with(|| {
                    let (module, function) = res.func(c.func);
                    (strings.id(function), strings.id(module))
                });
                let kind = self.strings.id(call_kind_name(c.how));
                let r = &mut self.rows;
                r.call_kind.push(kind);
                r.called_function.push(function);
                r.called_module.push(module);
                self.stats.calls += 1;
            }
            None => {
                r.call_kind.push_opt(None);
                r.called_function.push_opt(None);
                r.called_module.push_opt(None);
            }
        }
    }

    /// Write the row group once it is full.
    fn end_row(&mut self) -> Result<(), PostError> {
        if self.rows.len() >= self.rows_per_group {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PostError> {
        if self.rows.len() > 0 {
            self.rows.write_group(&mut self.writer, &self.strings).map_err(parquet_error)?;
            self.stats.row_groups += 1;
        }
        Ok(())
    }
}

impl<W: Write + Send> Sink for ParquetSink<W> {
    fn block(&mut self, b: &Block, names: &mut Names, res: &mut Resolver) -> Result<(), PostError> {
        let br = b.branch;
        let kind = self.kinds[br.kind as usize];
        let to = (br.to != 0).then(|| (br.to, Some(res.resolve(b.pid, br.to))));
        match &b.loc {
            Where::User(l) => {
                self.start_row(br.ts, Some(b.cpu), b.pid, br.tid, self.user, kind, br.icount);
                self.names(names, b.pid, br.tid);
                self.location(Some(b.start), l);
                self.branch(Some(br.from), to);
            }
            Where::Kernel(name) => {
                self.start_row(br.ts, Some(b.cpu), b.pid, br.tid, self.kernel, kind, br.icount);
                self.names(names, b.pid, br.tid);
                let function = self.strings.id(name);
                let r = &mut self.rows;
                r.address.push_opt(None);
                r.function.push(function);
                r.function_offset.push(0);
                r.module.push(self.kernel_module);
                r.file.push_opt(None);
                r.line.push_opt(None);
                self.branch(None, to);
            }
        }
        self.stats.branches += 1;
        self.stacks.block(b, names, res)?;
        self.calls(res);
        self.end_row()
    }

    fn trace_off(
        &mut self,
        off: &TraceOff,
        partial: Option<&Location>,
        at: &Location,
        names: &mut Names,
    ) -> Result<(), PostError> {
        self.stacks.trace_off(off, partial, at, names)?;
        // The last block never reached a branch; where it started is not kept, only its
        // function.
        if let Some(l) = partial {
            self.start_row(off.ts, None, off.pid, off.tid, self.user, self.end_kind, off.icount);
            self.names(names, off.pid, off.tid);
            self.location(None, l);
            self.branch(None, None);
            let counted = self.stacks.drain_calls().count() as u64;
            self.stats.calls_without_row += counted;
            let r = &mut self.rows;
            r.call_kind.push_opt(None);
            r.called_function.push_opt(None);
            r.called_module.push_opt(None);
            self.end_row()?;
        } else {
            self.stats.calls_without_row += self.stacks.drain_calls().count() as u64;
        }
        Ok(())
    }

    fn lost(&mut self, cpu: u16, lost: &Lost) -> Result<(), PostError> {
        self.lost = self.lost.saturating_add(lost.count);
        self.stacks.lost(cpu, lost)
    }

    fn gap(&mut self, cpu: u16, tids: &[u32], cause: GapCause) -> Result<(), PostError> {
        self.stacks.gap(cpu, tids, cause)?;
        self.stats.calls_without_row += self.stacks.drain_calls().count() as u64;
        Ok(())
    }
}

fn parquet_error(e: ParquetError) -> PostError {
    match e {
        ParquetError::External(e) => match e.downcast::<std::io::Error>() {
            Ok(io) => PostError::Write(*io),
            Err(e) => PostError::Write(std::io::Error::other(e)),
        },
        e => PostError::Write(std::io::Error::other(e)),
    }
}

/// Write the table of `trace` to `out` as a Parquet file, in row groups of `rows_per_group`
/// rows (the last one fewer).
pub fn write_parquet<W: Write + Send>(
    trace: &Trace,
    out: W,
    rows_per_group: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<ParquetStats, PostError> {
    let schema = Arc::new(::parquet::schema::parser::parse_message_type(SCHEMA).map_err(parquet_error)?);
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).map_err(parquet_error)?))
        .set_dictionary_enabled(true)
        .set_created_by(format!("itrace {}", env!("CARGO_PKG_VERSION")));
    // Minimum and maximum per page of the string columns cost a fifth of the export (a
    // comparison of every value) and skip nothing: a row group of a million blocks holds most
    // function and file names. The numeric columns keep theirs (seq and time ranges).
    for column in STRING_COLUMNS {
        props = props.set_column_statistics_enabled(ColumnPath::from(column), EnabledStatistics::None);
    }
    let props = props.build();
    let writer = SerializedFileWriter::new(out, schema, Arc::new(props)).map_err(parquet_error)?;
    let mut strings = Strings::default();
    let kinds = [
        BranchKind::Intrpt,
        BranchKind::Call,
        BranchKind::Return,
        BranchKind::Jump,
        BranchKind::Iret,
        BranchKind::Other,
        BranchKind::Undefd,
        BranchKind::Alloc,
        BranchKind::CondJump,
    ]
    .map(|k| strings.id(kind_name(k)));
    let mut sink = ParquetSink {
        writer,
        stacks: CallStacks::new(Collect { calls: true, ..Collect::default() }),
        rows: Rows::new(),
        rows_per_group: rows_per_group.max(1),
        end_kind: strings.id(END_KIND),
        user: strings.id("U"),
        kernel: strings.id("K"),
        kernel_module: strings.id("[kernel]"),
        kinds,
        strings,
        funcs: Vec::new(),
        called: Vec::new(),
        last_file: None,
        lost: 0,
        stats: ParquetStats::default(),
    };
    let (_, res) = replay(trace, true, &mut sink, progress)?;
    sink.stacks.close_all();
    sink.stats.calls_without_row += sink.stacks.drain_calls().count() as u64;
    sink.flush()?;
    let h = trace.header();
    let lost = trace.summary().map_or(0, crate::summary_lost).max(sink.lost);
    for (key, value) in [
        ("itrace.arch", h.arch.to_string()),
        ("itrace.mode", h.mode.to_string()),
        ("itrace.step", h.step_method.to_string()),
        ("itrace.lost_records", lost.to_string()),
    ] {
        sink.writer.append_key_value_metadata(KeyValue::new(key.to_string(), value));
    }
    sink.writer.close().map_err(parquet_error)?;
    sink.stats.notes = res.notes().to_vec();
    Ok(sink.stats)
}
