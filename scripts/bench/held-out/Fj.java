// A ForkJoinPool of two workers computing fib(30) by forking every call above 18, N times
// (held-out.sh): work-stealing threads that park and unpark.
//     java Fj N
import java.util.concurrent.*;
public class Fj {
    static class Fib extends RecursiveTask<Long> {
        final int n; Fib(int n) { this.n = n; }
        protected Long compute() {
            if (n < 18) return seq(n);
            Fib a = new Fib(n - 1); a.fork();
            long b = new Fib(n - 2).compute();
            return a.join() + b;
        }
        static long seq(int n) { return n < 2 ? n : seq(n - 1) + seq(n - 2); }
    }
    public static void main(String[] a) throws Exception {
        int reps = Integer.parseInt(a[0]);
        ForkJoinPool p = new ForkJoinPool(2);
        long s = 0;
        for (int i = 0; i < reps; i++) s += p.invoke(new Fib(30));
        if (s < 0) System.out.println(s);
    }
}
