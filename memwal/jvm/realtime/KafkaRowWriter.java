package memwal.realtime;

import java.io.IOException;
import java.io.Serializable;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/**
 * Hands the Kafka records of a Real-Time Mode task to memwal's writer process on this host.
 *
 * <p>Why on the JVM: PySpark's foreach writer pickles rows to its Python worker in batches that
 * only fill (or end with the task), which in Real-Time Mode holds a row until the real-time
 * batch ends, seconds later. Here each record is buffered for at most {@code lingerMs}
 * (or until {@code maxRows} wait) and sent, undecoded, over the writer process's Unix socket;
 * the writer process decodes, routes and writes it to its resident shard writers (Python,
 * {@code memwal.streaming.realtime}) and answers once the WAL holds it.
 *
 * <p>Frames are those of {@code memwal.write.process}: an 8-byte big-endian length, then the
 * bytes. A request is the header the driver pickled (opaque here) and one records frame
 * (layout: {@code memwal.streaming.realtime.records_frame}); the answer a status frame
 * ({@code O}, {@code E} or {@code C}: closing, send again) and a UTF-8 text frame.
 *
 * <p>Errors: a failed send fails the task (Spark then fails the query: Real-Time Mode does
 * not retry tasks), with the writer process's reason; nothing is acknowledged that was not
 * written.
 */
public class KafkaRowWriter extends ForeachWriter<Row> implements Serializable {
  private static final long serialVersionUID = 1L;

  private final String socket;
  private final byte[] header;
  private final String[] startCommand;
  private final int maxRows;
  private final long lingerMs;

  private transient Buffer buffer;
  private transient Thread flusher;
  private transient volatile Throwable failure;
  private transient volatile boolean open;
  private transient long epoch;

  /**
   * @param socket the writer process's socket path
   * @param headerBase64 the request header the driver pickled, base64
   * @param startCommand the command that starts the writer process when nobody listens
   *     (tab-separated: it waits until the socket answers, then exits)
   * @param maxRows records sent at once at most
   * @param lingerMs how long a record waits for others before it is sent
   */
  public KafkaRowWriter(String socket, String headerBase64, String startCommand, int maxRows, long lingerMs) {
    this.socket = socket;
    this.header = Base64.getDecoder().decode(headerBase64);
    this.startCommand = startCommand.split("\t");
    this.maxRows = maxRows;
    this.lingerMs = lingerMs;
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    buffer = new Buffer();
    failure = null;
    open = true;
    epoch = epochId;
    flusher = new Thread(this::lingerLoop, "memwal-realtime-" + partitionId + "-" + epochId);
    flusher.setDaemon(true);
    flusher.start();
    return true;
  }

  @Override
  public void process(Row row) {
    rethrow();
    boolean full;
    synchronized (this) {
      buffer.add(row);
      full = buffer.size() >= maxRows;
    }
    if (full) {
      sendBuffered();
      rethrow();
    }
  }

  @Override
  public void close(Throwable errorOrNull) {
    open = false;
    if (flusher != null) {
      // Not interrupted: a send under way would fail (the socket channel is interruptible);
      // the flusher sees open == false within lingerMs.
      try {
        flusher.join(TimeUnit.SECONDS.toMillis(60));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    if (errorOrNull == null) {
      sendBuffered();
      rethrow();
    }
  }

  private void lingerLoop() {
    while (open) {
      try {
        Thread.sleep(lingerMs);
      } catch (InterruptedException e) {
        return;
      }
      sendBuffered();
      if (failure != null) {
        return;
      }
    }
  }

  private void rethrow() {
    Throwable f = failure;
    if (f != null) {
      throw new RuntimeException("memwal real-time write failed: " + f.getMessage(), f);
    }
  }

  /** Sends what is buffered; one send at a time, in order (the lock is held while sending). */
  private synchronized void sendBuffered() {
    if (failure != null || buffer == null || buffer.size() == 0) {
      return;
    }
    byte[] records = buffer.frame(epoch);
    buffer = new Buffer();
    try {
      request(records);
    } catch (Throwable t) {
      failure = t;
    }
  }

  private void request(byte[] records) throws IOException {
    for (int attempt = 0; attempt < 5; attempt++) {
      try (SocketChannel channel = connect()) {
        writeFrame(channel, header);
        writeFrame(channel, records);
        byte[] status = readFrame(channel);
        byte[] reply = readFrame(channel);
        if (status.length == 1 && status[0] == 'O') {
          return;
        }
        if (status.length == 1 && status[0] == 'C') {
          continue; // the writer process is exiting idle: the next one takes it
        }
        throw new IOException(new String(reply, StandardCharsets.UTF_8));
      }
    }
    throw new IOException("the writer process at " + socket + " kept closing");
  }

  private SocketChannel connect() throws IOException {
    UnixDomainSocketAddress address = UnixDomainSocketAddress.of(socket);
    try {
      SocketChannel channel = SocketChannel.open(StandardProtocolFamily.UNIX);
      channel.connect(address);
      return channel;
    } catch (IOException nobody) {
      start();
      SocketChannel channel = SocketChannel.open(StandardProtocolFamily.UNIX);
      channel.connect(address);
      return channel;
    }
  }

  private void start() throws IOException {
    Process p = new ProcessBuilder(startCommand).redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
    try {
      if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0) {
        p.destroy();
        throw new IOException("could not start memwal's writer process: " + String.join(" ", startCommand));
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while starting memwal's writer process", e);
    }
  }

  private static void writeFrame(SocketChannel channel, byte[] bytes) throws IOException {
    ByteBuffer length = ByteBuffer.allocate(8).putLong(bytes.length).flip();
    while (length.hasRemaining()) {
      channel.write(length);
    }
    ByteBuffer body = ByteBuffer.wrap(bytes);
    while (body.hasRemaining()) {
      channel.write(body);
    }
  }

  private static byte[] readFrame(SocketChannel channel) throws IOException {
    ByteBuffer length = ByteBuffer.allocate(8);
    readFully(channel, length);
    ByteBuffer body = ByteBuffer.allocate((int) length.flip().getLong());
    readFully(channel, body);
    return body.array();
  }

  private static void readFully(SocketChannel channel, ByteBuffer into) throws IOException {
    while (into.hasRemaining()) {
      if (channel.read(into) < 0) {
        throw new IOException("the writer process closed the connection without an answer");
      }
    }
  }

  /** Kafka records column by column, as {@code records_frame} lays them out. */
  private static final class Buffer {
    private final List<byte[]> keys = new ArrayList<>();
    private final List<byte[]> values = new ArrayList<>();
    private final List<Integer> partitions = new ArrayList<>();
    private final List<Long> offsets = new ArrayList<>();
    private final List<Long> timestamps = new ArrayList<>();
    private long keyBytes;
    private long valueBytes;

    int size() {
      return offsets.size();
    }

    void add(Row row) {
      byte[] key = (byte[]) row.getAs("key");
      byte[] value = (byte[]) row.getAs("value");
      keys.add(key);
      values.add(value);
      keyBytes += key == null ? 0 : key.length;
      valueBytes += value == null ? 0 : value.length;
      partitions.add(row.<Integer>getAs("partition"));
      offsets.add(row.<Long>getAs("offset"));
      Object ts = row.getAs("timestamp");
      long ms = ts instanceof java.sql.Timestamp ? ((java.sql.Timestamp) ts).getTime()
          : ts instanceof Instant ? ((Instant) ts).toEpochMilli() : -1L;
      timestamps.add(ms);
    }

    /** n, epoch; offsets, timestamps (int64 each); partitions, key lengths, value lengths (int32, -1: null); key bytes; value bytes. */
    byte[] frame(long epoch) {
      int n = size();
      long total = 16L + 16L * n + 12L * n + keyBytes + valueBytes;
      ByteBuffer out = ByteBuffer.allocate(Math.toIntExact(total));
      out.putLong(n);
      out.putLong(epoch);
      for (long o : offsets) {
        out.putLong(o);
      }
      for (long t : timestamps) {
        out.putLong(t);
      }
      for (int p : partitions) {
        out.putInt(p);
      }
      for (byte[] k : keys) {
        out.putInt(k == null ? -1 : k.length);
      }
      for (byte[] v : values) {
        out.putInt(v == null ? -1 : v.length);
      }
      for (byte[] k : keys) {
        if (k != null) {
          out.put(k);
        }
      }
      for (byte[] v : values) {
        if (v != null) {
          out.put(v);
        }
      }
      return out.array();
    }
  }
}
