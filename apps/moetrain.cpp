#include <cstdio>
int main() { std::puts("moetrain: under construction"); return 0; }
