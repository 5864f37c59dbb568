package kafkadiode.dedup;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's checkpoint file manager for a checkpoint on a local disk, writing each new file
 * without a process.
 *
 * <p>Hadoop's local file system sets a new file's permissions with a {@code chmod} process when
 * its native library is absent (pyspark ships none), once for the file and once for its
 * {@code .crc}: four processes per micro-batch for the offset and commit logs. This manager
 * writes the temporary file with {@code FileOutputStream} (the process umask's permissions, no
 * checksum file) and leaves renaming, reading, listing and deleting to the parent, which reads
 * files with or without a {@code .crc}. See docs/dedup-internals.md, "A micro-batch's fixed
 * cost in the JVM".
 */
public final class LocalCheckpointFileManager extends FileSystemBasedCheckpointFileManager {

  public LocalCheckpointFileManager(Path path, Configuration hadoopConf) {
    super(path, hadoopConf);
    if (!"file".equals(fs().getScheme())) {
      throw new IllegalArgumentException(
          "LocalCheckpointFileManager needs a local checkpoint, not " + path);
    }
  }

  @Override
  public FSDataOutputStream createTempFile(Path path) {
    File file = new File(fs().makeQualified(path).toUri());
    try {
      // as Hadoop's create does (the metadata logs make their directory first anyway)
      File parent = file.getParentFile();
      if (parent != null && !parent.isDirectory() && !parent.mkdirs() && !parent.isDirectory()) {
        throw new IOException("cannot create the directory " + parent);
      }
      return new FSDataOutputStream(new FileOutputStream(file, false), null);
    } catch (IOException e) {
      // the Scala signature declares no exception; rethrown as it is, as the parent's would be
      throw LocalCheckpointFileManager.<RuntimeException>rethrow(e);
    }
  }

  @SuppressWarnings("unchecked")
  private static <T extends Throwable> T rethrow(Throwable e) throws T {
    throw (T) e;
  }
}
