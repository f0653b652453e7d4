"""The loader's epoch permutation, recomputed from its definition for the e2e tests that
must know which sample a rank reads first (io/loader.cpp's epoch_permutation over
core/rng.cpp: splitmix64, xoshiro256**, Lemire's bounded integers)."""
M = (1 << 64) - 1
def splitmix(state):
    state = (state + 0x9e3779b97f4a7c15) & M
    z = ((state ^ (state >> 30)) * 0xbf58476d1ce4e5b9) & M
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M
    return state, z ^ (z >> 31)
def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M
class Xoshiro:
    def __init__(self, seed):
        self.s = []
        for _ in range(4):
            seed, z = splitmix(seed)
            self.s.append(z)
    def next(self):
        s = self.s
        out = (rotl((s[1] * 5) & M, 7) * 9) & M
        t = (s[1] << 17) & M
        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t
        s[3] = rotl(s[3], 45)
        return out
    def below(self, n):  # Lemire's unbiased bounded integer
        m = self.next() * n
        if (m & M) < n:
            threshold = ((1 << 64) - n) % n
            while (m & M) < threshold:
                m = self.next() * n
        return m >> 64
def permutation(seed, epoch, n):
    s = seed ^ 0x5eed0fda7a ^ ((epoch * 0xd1b54a32d192ed03) & M)
    s, _ = splitmix(s)
    _, mixed = splitmix(s)
    rng, p = Xoshiro(mixed), list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        p[i], p[j] = p[j], p[i]
    return p
