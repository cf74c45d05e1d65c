// Two threads handing an integer back and forth N times through SynchronousQueues
// (held-out.sh): the JVM parks its threads on futexes. Prints the seconds taken.
//     java Pp N
import java.util.concurrent.*;
public class Pp {
  public static void main(String[] a) throws Exception {
    int n = Integer.parseInt(a[0]);
    SynchronousQueue<Integer> q1 = new SynchronousQueue<>(), q2 = new SynchronousQueue<>();
    Thread t = new Thread(() -> { try { for (int i = 0; i < n; i++) q2.put(q1.take() + 1); } catch (InterruptedException e) {} });
    t.start();
    long t0 = System.nanoTime(); int x = 0;
    for (int i = 0; i < n; i++) { q1.put(x); x = q2.take(); }
    System.out.println((System.nanoTime() - t0) / 1e9);
  }
}
